"""The console's colour tokens (``static/css/console.css``) give text at least WCAG AA contrast (4.5:1) on every
surface it is drawn on, in the light and the dark scheme, states a browser check may not reach included
(a warning badge inside a user message, a danger button); form fields' edges and the focus ring at least
3:1 (non-text contrast)."""

from __future__ import annotations

import re

import pytest

from tests.processes import REPO

CSS = REPO / "static" / "css" / "console.css"
DARK = "@media (prefers-color-scheme: dark)"
TEXT = ["fg", "muted", "accent", "danger", "ok", "warn"]
SURFACES = ["bg", "card", "code-bg", "user", "model", "tool", "handoff"]
#: (text, background) of the filled buttons: .button / button, button.danger.
BUTTONS = [("accent-fg", "accent"), ("accent-fg", "danger")]
TOKEN = re.compile(r"--([a-z-]+):\s*(#[0-9a-fA-F]{3,6})\b")


def _blocks(css: str) -> tuple[str, str]:
    """(the CSS outside the dark-scheme media blocks, the CSS inside them)."""
    outside, inside, rest = [], [], css
    while DARK in rest:
        before, rest = rest.split(DARK, 1)
        outside.append(before)
        depth, end = 0, len(rest)
        for i, char in enumerate(rest):
            depth += {"{": 1, "}": -1}.get(char, 0)
            if char == "}" and depth == 0:
                end = i + 1
                break
        inside.append(rest[:end])
        rest = rest[end:]
    outside.append(rest)
    return "".join(outside), "".join(inside)


def tokens() -> dict[str, dict[str, str]]:
    light_css, dark_css = _blocks(CSS.read_text(encoding="utf-8"))
    light = dict(TOKEN.findall(light_css))
    return {"light": light, "dark": {**light, **dict(TOKEN.findall(dark_css))}}


def luminance(colour: str) -> float:
    hexa = colour.lstrip("#")
    if len(hexa) == 3:
        hexa = "".join(c * 2 for c in hexa)
    channels = [int(hexa[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_text_and_buttons_have_aa_contrast_on_every_surface(scheme):
    colours = tokens()[scheme]
    pairs = [(t, s) for t in TEXT for s in SURFACES] + BUTTONS
    low = {f"{t} on {s}": round(contrast(colours[t], colours[s]), 2) for t, s in pairs
           if contrast(colours[t], colours[s]) < 4.5}
    assert not low, f"{scheme}: below 4.5:1: {low}"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_form_field_edges_and_the_focus_ring_stand_out_from_the_page(scheme):
    colours = tokens()[scheme]
    low = {f"{edge} on {s}": round(contrast(colours[edge], colours[s]), 2)
           for edge in ("control-border", "accent") for s in ("bg", "card", "code-bg")
           if contrast(colours[edge], colours[s]) < 3}
    assert not low, f"{scheme}: below 3:1: {low}"
