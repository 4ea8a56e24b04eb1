"""Console security: the permission matrix (anonymous, non-staff, staff outsider, viewer, operator × every
view and action), CSRF on every POST, HTTP methods, and XSS payloads rendering as inert text everywhere."""

from __future__ import annotations

import re
from urllib.parse import parse_qs

import pytest
from django.urls import reverse

from chatflow_agent.core.agent import Agent
from chatflow_agent.core.tools import tool
from sessions_app.models import ChatMessage, ChatSession, OperatorAction
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas

pytestmark = pytest.mark.django_db

SID = "tg:998877"
READ_VIEWS = ["/sessions/", "/sessions/?q=refund", f"/sessions/{SID}/", "/audit/", "/agents/"]
ACTION_VIEWS = {  # GET pages that belong to an action: its permission is needed to see them
    f"/actions/rollback-preview/{SID}/?turn=1": "rollback",
    f"/actions/delete-confirm/{SID}/": "delete",
}
ACTIONS = {
    "handoff": (f"/actions/handoff/{SID}/", {"agent": "Tech"}),
    "rollback": (f"/actions/rollback/{SID}/", {"turn": "1"}),
    "delete": (f"/actions/delete/{SID}/", {}),
}


def form(action: str) -> tuple[str, dict]:
    """The action's path and form data; a rollback carries its preview's fingerprint, as the page's form does."""
    path, data = ACTIONS[action]
    return path, cv.rollback_form(SID, data["turn"]) if action == "rollback" else data


PERSONAS = {
    "anonymous": lambda: None,
    "customer": personas.customer,
    "outsider": personas.outsider,
    "viewer": personas.viewer,
    "operator": personas.operator,
}


@pytest.fixture
def story():
    return cv.store(SID, cv.support_story())


def unchanged() -> tuple:
    return (list(ChatSession.objects.values_list("session_id", "active_agent_name")),
            ChatMessage.objects.count(), OperatorAction.objects.count())


# ---- permission matrix -----------------------------------------------------------------------
@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("path", READ_VIEWS + list(ACTION_VIEWS))
def test_who_may_see_each_page(story, persona, path):
    client = personas.client_for(PERSONAS[persona]())

    response = client.get(path)

    if persona == "anonymous":
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=")
    elif persona in ("customer", "outsider") or (persona == "viewer" and path in ACTION_VIEWS):
        assert response.status_code == 403
    else:
        assert response.status_code == 200


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("action", ACTIONS)
def test_who_may_do_each_action(story, persona, action):
    client = personas.client_for(PERSONAS[persona]())
    path, data = form(action)
    before = unchanged()

    response = client.post(path, data)

    if persona == "operator":
        kind = {"handoff": "force_handoff", "rollback": "rollback", "delete": "delete"}[action]
        assert response.status_code == 302 and OperatorAction.objects.get().action == kind
    else:
        assert response.status_code == (302 if persona == "anonymous" else 403)
        assert unchanged() == before


@pytest.mark.parametrize("perm", ["force_handoff", "rollback_session", "delete_session"])
def test_each_action_needs_its_own_permission(story, perm):
    from django.contrib.auth.models import Permission

    user = personas.viewer("vera.viewer")
    user.user_permissions.add(Permission.objects.get(codename=perm, content_type__app_label="sessions_app"))
    client = personas.client_for(user)
    allowed = {"force_handoff": "handoff", "rollback_session": "rollback", "delete_session": "delete"}[perm]

    statuses = {name: client.post(*form(name)).status_code for name in ("handoff", "rollback")}
    statuses["delete"] = client.post(*ACTIONS["delete"]).status_code

    assert statuses == {name: 302 if name == allowed else 403 for name in ACTIONS}


def test_a_viewer_sees_no_action_controls_and_an_operator_does(story):
    viewer = personas.client_for(personas.viewer()).get(f"/sessions/{SID}/").content.decode()
    operator = personas.client_for(personas.operator()).get(f"/sessions/{SID}/").content.decode()

    for control in ("Force handoff", "Roll back to the end of turn", "Delete session"):
        assert control not in viewer and control in operator


def test_anonymous_htmx_requests_are_sent_to_the_login_page_as_a_whole(story):
    response = personas.client_for(None).get("/sessions/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and response["HX-Redirect"] == "/accounts/login/?next=%2Fsessions%2F"


def test_the_login_page_logs_a_staff_user_in_and_returns_to_the_console(story):
    personas.viewer()
    client = personas.client_for(None)

    login = client.get(f"/accounts/login/?next=/sessions/{SID}/")
    response = client.post("/accounts/login/", {"username": "victor.viewer", "password": personas.PASSWORD,
                                                "next": f"/sessions/{SID}/"})

    assert login.status_code == 200 and b'name="password"' in login.content
    assert response.status_code == 302 and response["Location"] == f"/sessions/{SID}/"
    assert client.get(response["Location"]).status_code == 200


# ---- an expired login and an action --------------------------------------------------------------
PAGE = f"/sessions/{SID}/?order=oldest&page=1"
TAKEOVER_ACTIONS = [f"/actions/takeover/{SID}/", f"/actions/handback/{SID}/", f"/actions/reply/{SID}/"]


def next_of(login_url: str) -> str:
    """The ``next`` of a URL of the login page."""
    path, query = login_url.split("?", 1)
    assert path == "/accounts/login/"
    return parse_qs(query)["next"][0]


def log_in(client, next_url: str):
    personas.operator()
    return client.post("/accounts/login/", {"username": "olga.operator", "password": personas.PASSWORD,
                                            "next": next_url}, follow=True)


@pytest.mark.parametrize("path", [ACTIONS["handoff"][0], ACTIONS["delete"][0], *TAKEOVER_ACTIONS])
def test_an_action_after_the_login_expired_logs_in_back_to_the_page_it_came_from(story, path):
    client = personas.client_for(None)
    before = unchanged()

    response = client.post(path, {"agent": "Tech"}, HTTP_REFERER=f"http://testserver{PAGE}")

    assert response.status_code == 302 and unchanged() == before
    assert next_of(response["Location"]) == PAGE
    landed = log_in(client, PAGE)
    assert landed.status_code == 200 and landed.redirect_chain[-1][0] == PAGE
    assert f"Session <code class=\"sid\">{SID}</code>" in landed.content.decode()


@pytest.mark.parametrize("referer", ["", "http://evil.example/sessions/", f"http://testserver/actions/handoff/{SID}/"],
                         ids=["none", "another-site", "the-action-itself"])
def test_without_a_page_to_return_to_an_action_logs_in_to_its_sessions_page(story, referer):
    client = personas.client_for(None)
    extra = {"HTTP_REFERER": referer} if referer else {}

    response = client.post(ACTIONS["handoff"][0], {"agent": "Tech"}, **extra)

    assert next_of(response["Location"]) == f"/sessions/{SID}/"
    assert log_in(client, f"/sessions/{SID}/").status_code == 200


def test_an_htmx_action_after_the_login_expired_logs_in_back_to_the_page_it_was_sent_from(story):
    response = personas.client_for(None).post(
        ACTIONS["handoff"][0], {"agent": "Tech"}, HTTP_HX_REQUEST="true",
        HTTP_HX_CURRENT_URL=f"http://testserver{PAGE}", HTTP_REFERER="http://testserver/sessions/")

    assert response.status_code == 200 and next_of(response["HX-Redirect"]) == PAGE


def test_an_htmx_fragment_after_the_login_expired_logs_in_back_to_the_whole_page(story):
    response = personas.client_for(None).get(f"/actions/delete-confirm/{SID}/", HTTP_HX_REQUEST="true",
                                             HTTP_HX_CURRENT_URL=f"http://testserver{PAGE}")

    assert next_of(response["HX-Redirect"]) == PAGE


@pytest.mark.parametrize("path", ["/sessions/", f"/sessions/{SID}/", "/audit/", "/agents/",
                                  f"/actions/rollback-preview/{SID}/?turn=1", f"/actions/delete-confirm/{SID}/"])
def test_pages_refuse_post(story, path):
    assert personas.client_for(personas.operator()).post(path).status_code == 405


@pytest.mark.parametrize("action", ACTIONS)
def test_actions_refuse_get(story, action):
    before = unchanged()
    assert personas.client_for(personas.operator()).get(ACTIONS[action][0]).status_code == 405
    assert unchanged() == before


# ---- CSRF ------------------------------------------------------------------------------------
@pytest.mark.parametrize("action", ACTIONS)
def test_actions_without_a_csrf_token_are_refused(story, action):
    client = personas.client_for(personas.operator(), csrf=True)
    before = unchanged()

    response = client.post(*form(action), HTTP_HX_REQUEST="true")

    assert response.status_code == 403 and unchanged() == before


@pytest.mark.parametrize("action", ACTIONS)
def test_actions_with_the_token_htmx_sends_from_the_body_headers_succeed(story, action):
    client = personas.client_for(personas.operator(), csrf=True)
    page = client.get(f"/sessions/{SID}/").content.decode()
    token = page.split('hx-headers=\'{"X-CSRFToken": "', 1)[1].split('"', 1)[0]

    forged = client.post(*form(action), HTTP_X_CSRFTOKEN="x" * 64, HTTP_HX_REQUEST="true")
    response = client.post(*form(action), HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")

    assert forged.status_code == 403
    assert response.status_code == 200 and OperatorAction.objects.count() == 1


def test_every_action_form_carries_a_csrf_token_for_browsers_without_javascript(story):
    client = personas.client_for(personas.operator())
    pages = [client.get(p).content.decode() for p in (f"/sessions/{SID}/", *ACTION_VIEWS)]
    for page in pages:
        assert page.count('method="post"') == page.count('name="csrfmiddlewaretoken"')


# ---- XSS -------------------------------------------------------------------------------------
PAYLOADS = {
    "script": ("<script>alert(1)</script>", "&lt;script&gt;alert(1)&lt;/script&gt;"),
    "img": ("<img src=x onerror=alert(1)>", "&lt;img src=x onerror=alert(1)&gt;"),
    "markdown": ("[x](javascript:alert(1))", "[x](javascript:alert(1))"),
    "iframe": ("<iframe srcdoc=\"<script>parent.document.title='pwned'</script>\">",
               "&lt;iframe srcdoc=&quot;&lt;script&gt;parent.document.title=&#x27;pwned&#x27;"
               "&lt;/script&gt;&quot;&gt;"),
}


def hostile_session(payload: str) -> str:
    """Every place content reaches the console carries the payload, tagged with where it came from."""
    session_id = f"S:{payload}"
    cv.store(session_id, [
        cv.user(f"U:{payload}"),
        cv.model(f"M:{payload}", [cv.call("c1", "check_order_status", order_id=f"A:{payload}"),
                                  cv.call("c2", "get_invoice", invoice_id="1")]),
        cv.results(cv.result("c1", "check_order_status", {"note": f"R:{payload}"}),
                   cv.result("c2", "get_invoice", f"E:{payload}", error=True),
                   cv.result("c3", f"O:{payload}", "orphan")),
        cv.model(f"M2:{payload}"),
        cv.user("second turn"),
    ], metadata={"channel": f"V:{payload}", f"K:{payload}": "key", "nested": {"n": f"N:{payload}"}})
    return session_id


VENDORED_SCRIPT = re.compile(r'<script src="/static/[\w./-]+\.js"(?: defer)?></script>')


def assert_inert(body: str, scripts: int) -> None:
    """No tag a payload could have produced; the only scripts are the site's own static files."""
    assert (len(VENDORED_SCRIPT.findall(body)) >= 1) == bool(scripts)
    assert "<script" not in VENDORED_SCRIPT.sub("", body)
    for raw in ("<img", "<iframe", "javascript:alert(1)\"", "href=\"javascript", "onerror=alert(1)>"):
        assert raw not in body


@pytest.mark.parametrize("kind", PAYLOADS)
def test_payloads_in_every_field_render_as_inert_text(kind):
    payload, escaped = PAYLOADS[kind]
    session_id = hostile_session(payload)
    client = personas.client_for(personas.operator())
    client.post(reverse("sessions-handoff-session", args=[session_id]), {"agent": "Tech", "reason": f"H:{payload}"})
    detail_url = reverse("sessions-show-session", args=[session_id])

    pages = {
        "list": client.get("/sessions/"),
        "search": client.get("/sessions/", {"q": payload}, HTTP_HX_REQUEST="true"),
        "detail": client.get(detail_url),
        "history": client.get(detail_url, {"order": "oldest"}, HTTP_HX_REQUEST="true"),
        "preview": client.get(reverse("sessions-preview-rollback", args=[session_id]), {"turn": "1"}),
        "delete": client.get(reverse("sessions-confirm-delete", args=[session_id]), HTTP_HX_REQUEST="true"),
        "audit": client.get("/audit/", {"session": session_id}),
    }

    for name, response in pages.items():
        assert response.status_code == 200, name
        assert_inert(response.content.decode(), 0 if response.wsgi_request.headers.get("HX-Request") else 1)
    in_json = escaped.replace("&quot;", "\\&quot;")  # inside pretty-printed JSON strings quotes are \"
    detail = pages["detail"].content.decode()
    for tag in ("S", "U", "M", "M2", "V", "K", "H"):
        assert f"{tag}:{escaped}" in detail, tag
    for tag in ("A", "R", "N"):
        assert f"{tag}:{in_json}" in detail, tag
    assert f"E:{escaped}" in detail and f"O:{escaped}" in detail
    assert f"S:{escaped[:10]}" in pages["search"].content.decode()  # found; its id shown escaped (truncated)
    assert "second turn" in pages["list"].content.decode()  # the last message is the preview
    assert f"A:{in_json}" in pages["preview"].content.decode()  # the call whose side effect is not undone
    assert f"H:{in_json}" in pages["audit"].content.decode()


def evil_team() -> Agent:
    """A registry whose agent names, instructions and tool docs carry payloads (for the agents page)."""
    payload = PAYLOADS["iframe"][0] + PAYLOADS["img"][0]

    @tool
    def lookup(query: str) -> str:
        """Look things up <script>alert(1)</script>"""
        return query

    second = Agent(name=f"B{payload}", instructions=f"I:{payload}", model="demo")
    first = Agent(name="<script>alert(1)</script>", instructions=f"I:{payload}", model="demo", tools=[lookup],
                  handoffs=[second])
    second.add_handoff(first)
    return first


def test_agent_names_instructions_and_tool_docs_render_inert_on_the_agents_page(settings):
    settings.CHATFLOW_AGENTS = "tests.sessions_app.test_console_security.evil_team"
    body = personas.client_for(personas.operator()).get("/agents/").content.decode()

    assert_inert(body, 1)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<svg" in body
    assert "I:&lt;iframe srcdoc=" in body and "Look things up &lt;script&gt;" in body


def test_a_refused_request_is_logged_in_one_line(story, caplog):
    """A 403 is the site working as meant: its log line carries no traceback (a 5xx would)."""
    viewer = personas.client_for(personas.viewer())
    with caplog.at_level("WARNING", logger="django.request"):
        for path in ("/chat/", *ACTION_VIEWS):
            assert viewer.get(path).status_code == 403
        path, data = form("delete")
        assert viewer.post(path, data).status_code == 403
    refusals = [r for r in caplog.records if r.name == "django.request"]
    assert len(refusals) == 4
    assert all(r.getMessage().startswith("Forbidden") and r.exc_info is None for r in refusals)
    assert all("Traceback" not in caplog.handler.format(r) for r in refusals)
