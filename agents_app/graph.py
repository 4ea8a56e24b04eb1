"""The handoff graph as drawing coordinates for a server-rendered SVG (the template escapes every name).

Agents sit on a circle in registry order (starting agent at the top); each handoff is an arrow from
the edge of one node's circle to the edge of the other's, so arrowheads are not hidden under nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chatflow_agent.core.agent import Agent

__all__ = ["Graph", "layout"]


@dataclass
class Node:
    name: str
    x: float
    y: float
    starting: bool


@dataclass
class Edge:
    source: str
    target: str
    x1: float
    y1: float
    x2: float
    y2: float
    both_ways: bool


@dataclass
class Graph:
    width: int
    height: int
    radius: int
    nodes: list[Node]
    edges: list[Edge]


def layout(agents: list[Agent], size: int = 420, radius: int = 34) -> Graph:
    """Nodes on a circle of the given ``size`` (px) and one edge per handoff between registered agents."""
    centre, ring = size / 2, size / 2 - radius - 16
    n = max(1, len(agents))
    nodes: dict[str, Node] = {}
    for i, agent in enumerate(agents):
        angle = -math.pi / 2 + 2 * math.pi * i / n
        x, y = (centre, centre) if n == 1 else (centre + ring * math.cos(angle), centre + ring * math.sin(angle))
        nodes[agent.name] = Node(agent.name, round(x, 1), round(y, 1), i == 0)
    pairs = {(a.name, h.name) for a in agents for h in a.handoffs if h.name in nodes and h.name != a.name}
    edges = []
    for source, target in sorted(pairs):
        a, b = nodes[source], nodes[target]
        dx, dy = b.x - a.x, b.y - a.y
        dist = math.hypot(dx, dy) or 1.0
        ux, uy = dx / dist, dy / dist
        both = (target, source) in pairs
        # Two-way handoffs: offset each direction sideways so both arrows show.
        ox, oy = (-uy * 6, ux * 6) if both else (0.0, 0.0)
        edges.append(Edge(source, target,
                          round(a.x + ux * radius + ox, 1), round(a.y + uy * radius + oy, 1),
                          round(b.x - ux * (radius + 4) + ox, 1), round(b.y - uy * (radius + 4) + oy, 1), both))
    return Graph(size, size, radius, list(nodes.values()), edges)
