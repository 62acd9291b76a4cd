"""A per-rank view of a ``%%distributed`` cell: one tab per rank beside the merged lines.

Shown when a cell ran on several ranks and one failed or their output is long. Above 8 ranks the failing
ranks' tabs come first and the summary counts outcomes (``64 ranks · 63 ok · 1 error (rank 17)``).
Plain HTML and CSS (radio buttons as tabs, no script), so it works in JupyterLab and in a saved notebook;
where a viewer strips the styles, the ranks' panes show one below the other.
"""

from __future__ import annotations

import html
import uuid

from workbench.pool.rankmap import ranks_named
from workbench.session.results import plain_traceback

# Output longer than this many lines (all ranks together) gets the per-rank view even when nothing failed.
LONG_LINES = 12
FAILED = ("error", "died", "killed", "lost")  # outcomes of a rank's own failure (not our interrupt)
MANY = 8  # above this many ranks: failing tabs first, the summary counts outcomes
_MARKS = {"ok": "", "error": " ✗", "died": " ✗", "killed": " ✗", "stopped": " ■", "interrupted": " ■",
          "lost": " ✗"}


def wanted(result) -> bool:
    """Whether a cell's result gets the per-rank view: several ranks, and a failure or long output.

    >>> from types import SimpleNamespace as R
    >>> ok, failed = R(outcome="ok", stdout="a\\n", stderr=""), R(outcome="error", stdout="", stderr="")
    >>> stopped = R(outcome="interrupted", stdout="", stderr="")
    >>> [wanted(R(ranks=ranks)) for ranks in ([ok, failed], [ok, ok], [failed], [stopped, stopped])]
    [True, False, False, False]
    """
    if len(result.ranks) < 2:
        return False
    lines = sum((r.stdout + r.stderr).count("\n") for r in result.ranks)
    return lines > LONG_LINES or any(r.outcome in FAILED for r in result.ranks)


def rank_tabs(result, world_size: int) -> dict:
    """A display bundle: a tab per rank with its own output and error; the first failing rank selected.

    >>> from types import SimpleNamespace as R
    >>> bad = R(rank=R(rank=1), outcome="error", stdout="", stderr="", error=R(traceback="ValueError: x"))
    >>> cut = R(rank=R(rank=0), outcome="stopped", stdout="", stderr="", error=None, where="cell line 2")
    >>> bundle = rank_tabs(R(ranks=[cut, bad]), world_size=2)
    >>> bundle["text/plain"]
    'per rank (world size 2): rank 0 stopped · rank 1 error'
    >>> page = bundle["text/html"]
    >>> 'checked><label class="wb-fail"' in page, "stopped at cell line 2" in page
    (True, True)
    """
    name = f"wb-ranks-{uuid.uuid4().hex[:8]}"
    ranks = tab_order(result.ranks)
    failing = [i for i, r in enumerate(ranks) if r.outcome in FAILED]
    root = _root_cause(result)
    chosen = next((i for i, r in enumerate(ranks) if r is root), failing[0] if failing else 0)
    tabs, panes, rules = [], [], []
    for i, r in enumerate(ranks):
        k = i + 1
        rules.append(f"#{name}>input:nth-of-type({k}):checked~div:nth-of-type({k}){{display:block}}")
        css = ' class="wb-fail"' if r.outcome in FAILED else ""
        tabs.append(f'<input type="radio" name="{name}" id="{name}-{k}"{" checked" * (i == chosen)}>'
                    f'<label{css} for="{name}-{k}" title="{r.outcome}">rank {r.rank.rank}'
                    f"{_MARKS.get(r.outcome, '')}</label>")
        panes.append(f"<div>{_pane(r, in_error_block=r is root)}</div>")
    style = (f"#{name}>input{{display:none}}"
             f"#{name}>label{{display:inline-block;padding:1px 10px;margin-right:2px;cursor:pointer;"
             "border:1px solid var(--jp-border-color1,#ccc);border-bottom:none;font-family:monospace}"
             f"#{name}>input:checked+label{{background:var(--jp-layout-color2,#eee);font-weight:bold}}"
             f"#{name}>label.wb-fail{{color:var(--jp-error-color1,#c00)}}"
             f"#{name}>div{{display:none;border:1px solid var(--jp-border-color1,#ccc);padding:2px 8px;"
             "max-height:24em;overflow:auto}"
             f"#{name} pre{{margin:0}}#{name} .wb-err{{color:var(--jp-error-color1,#c00)}}" + "".join(rules))
    head = f'<div class="wb-RankTabs" id="{name}" data-world-size="{world_size}"><style>{style}</style>'
    summary = outcome_summary(ranks)
    return {"text/html": head + "".join(tabs) + "".join(panes) + "</div>",
            "text/plain": f"per rank (world size {world_size}): {summary}"}


def tab_order(ranks: list) -> list:
    """The ranks in the order of their tabs: by rank, and above :data:`MANY` ranks the failing ones first
    (at 64 ranks the one that failed is what a person looks for).

    >>> from types import SimpleNamespace as R
    >>> rs = [R(rank=R(rank=i), outcome="error" if i == 7 else "ok") for i in range(10)]
    >>> [r.rank.rank for r in tab_order(rs)][:3], [r.rank.rank for r in tab_order(rs[:3])]
    ([7, 0, 1], [0, 1, 2])
    """
    if len(ranks) <= MANY:
        return list(ranks)
    return sorted(ranks, key=lambda r: r.outcome not in FAILED)  # stable: by rank within each


def outcome_summary(ranks: list) -> str:
    """Each rank's outcome, or above :data:`MANY` ranks the count of each outcome with the failing ranks.

    >>> from types import SimpleNamespace as R
    >>> rs = [R(rank=R(rank=i), outcome="error" if i in (3, 4) else "ok") for i in range(64)]
    >>> outcome_summary(rs)
    '64 ranks · 62 ok · 2 error (ranks 3-4)'
    >>> outcome_summary(rs[:2])
    'rank 0 ok · rank 1 ok'
    """
    if len(ranks) <= MANY:
        return " · ".join(f"rank {r.rank.rank} {r.outcome}" for r in ranks)
    counts: dict[str, list[int]] = {}
    for r in ranks:
        counts.setdefault(r.outcome, []).append(r.rank.rank)
    parts = [f"{len(ranks)} ranks"]
    for outcome, which in sorted(counts.items(), key=lambda kv: (kv[0] in FAILED, -len(kv[1]))):
        named = f" ({ranks_named(which)})" if outcome != "ok" else ""
        parts.append(f"{len(which)} {outcome}{named}")
    return " · ".join(parts)


def _root_cause(result):
    """The rank whose traceback the cell's error shows (:class:`~workbench.errors.RankError`): its pane
    says what it raised and points there instead of repeating it."""
    failures = getattr(result, "failures", None)
    if failures is None:
        return None
    ranked = failures()
    own = [f for f in ranked if f.outcome in ("error", "died", "killed")] or ranked
    return own[0] if own else None


def _pane(r, in_error_block: bool = False) -> str:
    parts = []
    if r.stdout:
        parts.append(f"<pre>{html.escape(r.stdout)}</pre>")
    if r.stderr:
        parts.append(f'<pre class="wb-err">{html.escape(r.stderr)}</pre>')
    if r.outcome == "lost":  # an elastic run went on without it: how it went, and when
        gone = r.lost or "lost"
        parts.append(f'<pre class="wb-err">{html.escape(gone)}; the run went on without it</pre>')
        return "".join(parts)
    if r.outcome in ("stopped", "interrupted"):  # our own interrupt: where it stopped, not our traceback
        parts.append(f"<pre>stopped at {html.escape(r.where or 'an unknown line')}</pre>")
        return "".join(parts)
    if in_error_block and plain_traceback(r.error):
        said = f"raised {r.error.ename}: {r.error.evalue} (its traceback is in the error below)"
        parts.append(f'<pre class="wb-err">{html.escape(said)}</pre>')
        return "".join(parts)
    if r.outcome in ("died", "killed") and getattr(r.error, "ename", None) == "RankDied":
        parts.append(f'<pre class="wb-err">{html.escape(f"{r.outcome}: {r.error.evalue}")}</pre>')
        return "".join(parts)
    error = plain_traceback(r.error) or (str(r.error) if r.error is not None else "")
    if error:
        parts.append(f'<pre class="wb-err">{html.escape(error)}</pre>')
    return "".join(parts) or "<pre>(no output)</pre>"
