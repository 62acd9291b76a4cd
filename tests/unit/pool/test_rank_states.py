"""Which ranks are busy (issue 40, point 9: ``%dist start``'s table said ranks "busy" right after "ready",
25 to 42 of 64 in JupyterLab): the controller's hub files a finished request after the client has its reply,
so :func:`~workbench.pool.watch.queues.rank_states` must not take the hub's word for the client's own requests
that were answered. The client here keeps its books as ipyparallel 9's does: ``history`` (every request that
expects a reply), ``outstanding`` (those not answered yet), and ``results`` emptied as soon as a request's
future is done (so it cannot tell an answered request: the old code asked it)."""

from __future__ import annotations

from workbench.pool.watch.queues import answered_here, rank_states


class Client:
    """An ipyparallel client and the hub's books as it asks them: ``hub`` is ``{engine id: [msg ids]}``."""

    def __init__(self, hub: dict[int, list[str]]):
        self.ids = sorted(hub)
        self.hub = hub
        self.history: list[str] = []
        self.outstanding: set[str] = set()
        self.results: dict = {}

    def send(self, msg_id: str, engine_id: int) -> None:
        self.outstanding.add(msg_id)
        self.history.append(msg_id)
        self.hub[engine_id].append(msg_id)  # the hub files the request as it passes

    def reply(self, msg_id: str) -> None:
        """The reply reaches the client (ipyparallel: out of outstanding, into results, then dropped from
        results when its future is done); the hub has not filed it yet."""
        self.outstanding.discard(msg_id)

    def queue_status(self, targets, verbose):
        assert verbose
        return {eid: {"queue": list(self.hub[eid]), "completed": [], "tasks": []} for eid in targets} | {
            "unassigned": []}


def test_a_request_the_client_has_the_reply_of_is_not_busy_though_the_hub_still_lists_it():
    client = Client({0: [], 1: [], 2: []})
    for eid in (0, 1, 2):  # the start's last call on every rank
        client.send(f"connect-{eid}", eid)
    client.reply("connect-0")
    client.reply("connect-1")  # rank 2's reply has not come: it still runs there
    assert rank_states(client, {0: 0, 1: 1, 2: 2}) == {0: "idle", 1: "idle", 2: "busy"}


def test_another_clients_request_is_busy_as_the_hub_says():
    client = Client({0: ["someone-elses"], 1: []})  # another notebook's cell on engine 0
    client.send("mine", 1)
    client.reply("mine")
    assert rank_states(client, {0: 0, 1: 1}) == {0: "busy", 1: "idle"}
    # a look-only client (the JupyterLab server's) sent nothing: every request the hub lists is busy to it
    looker = Client({0: ["a"], 1: []})
    assert rank_states(looker, {0: 0, 1: 1}) == {0: "busy", 1: "idle"}


def test_answered_here_asks_only_about_the_ids_given():
    client = Client({0: []})
    for m in ("a", "b", "c"):
        client.send(m, 0)
    client.reply("a")
    client.reply("b")
    assert answered_here(client, {"a", "c", "x"}) == {"a"}
    assert answered_here(client, set()) == set()
