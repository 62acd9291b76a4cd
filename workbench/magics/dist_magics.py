"""``%dist``, ``%%distributed`` and ``%%local``.

Each magic parses its line, calls the Session, and displays what came back; user
mistakes become ``UsageError`` before any process is touched.
"""

from __future__ import annotations

import os
import sys

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.display import display, publish_display_data

from workbench import lines
from workbench import session as session_mod
from workbench.config import PoolConfig
from workbench.errors import CellInterrupted, CellTimeout, NoPoolError, PoolGone, RankError
from workbench.magics import rank_tabs
from workbench.magics.args import parse_cell, parse_dist, pool_config_options
from workbench.magics.output import LineMerger, print_stream
from workbench.pool.records.state import allocation_words
from workbench.session import Session, format_ranks, ranks_text
from workbench.session.stack_report import started_lines
from workbench.tables import format_table

STATUS_COLUMNS = ["rank", "host", "pid", "device", "state"]


@magics_class
class DistributedMagics(Magics):
    """``%dist start|status|stop|restart|scale|check|push|pull|auto|attach|stacks|debug|split|join``,
    ``%%distributed``,
    ``%%local``."""

    def __init__(self, shell):
        super().__init__(shell)
        self._auto_on = False
        self._running_local = False

    # -- %dist -------------------------------------------------------------------------
    @line_magic
    def dist(self, line: str):
        """Control the pool.

        ``%dist start [-n N] [--launcher local|slurm|mpi|ssh] [--backend auto|gloo|nccl] [--timeout S]
        [--nodes K] [--gpus-per-node G] [--partition P] [--time T] [--account A] [--hosts a,b]
        [--interface IF | --address IP] [--idle-release S] [--oversubscribe] [--share-gpus] [--name NAME]
        [--collective-timeout S] [--launcher-options JSON]`` (one option per ``PoolConfig`` field),
        ``%dist status``,
        ``%dist stop``, ``%dist restart``, ``%dist scale N``, ``%dist check [--size-mb M]``,
        ``%dist push NAME... [--ranks R | --on SUBMESH]``, ``%dist pull NAME [--rank R] [--on SUBMESH]``,
        ``%dist auto on|off``,
        ``%dist attach [NAME] [--on SUBMESH]``, ``%dist stop [--all]``,
        ``%dist run script.py [--ranks R | --on SUBMESH] [--timeout S] [--quiet] [-- args]`` (a torchrun
        script, unchanged),
        ``%dist stacks [--ranks R | --on SUBMESH] [--native]``,
        ``%dist debug RANK [--frame K -e EXPR]``,
        ``%dist split SIZE SIZE... [--names a,b]`` (sub-meshes, each its own process group), ``%dist join``.

        Example: ``%dist start --launcher slurm --nodes 2 --gpus-per-node 4 --partition gpu --interface ib0``.
        """
        args = parse_dist(line)
        return getattr(self, f"_dist_{args.command}")(args)

    def _session(self, what: str) -> Session:
        try:
            return session_mod.current()
        except NoPoolError as exc:  # names the running pools there are and how to attach
            raise UsageError(str(exc).replace("this needs", f"{what} needs")) from None

    def _dist_start(self, args):
        s = _driven()
        if s is not None:
            raise UsageError(f"pool {s.name} ({ranks_text(s.world_size)}) is already running in this "
                             "notebook: `%dist stop` it first.")
        try:
            config = PoolConfig(**pool_config_options(args))
            s = Session(config)  # resolves --interface: a wrong name is a usage error too
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        handle = display({"text/plain": "starting pool"}, raw=True, display_id=True)

        def progress(message: str) -> None:
            if handle is not None:
                handle.update({"text/plain": message}, raw=True)
            else:
                print(message)

        try:
            s.start(progress=progress)
        except ValueError as exc:  # e.g. loopback with engines on other machines: nothing was started
            raise UsageError(str(exc)) from None
        print(f"pool {s.name} ({s.pool_id}): {ranks_text(s.world_size)}, backend {s.backend}")
        if s.config.keep:  # once, in short lines: a long one wrapped, leaving a lone "`)" on a line
            print("kept by the Jupyter server: it outlives this kernel.\n"
                  f"after a kernel restart: `%dist attach {s.name}`")
        for line in [_where(s), *s.pool.notes]:  # inside a Slurm job: which, its time left; part of it
            if line:
                print(line)
        print(format_table(s.status(), _columns(s)))

    def _dist_attach(self, args):
        s = _driven()
        if s is not None:
            raise UsageError(f"this notebook already drives pool {s.name}: `%dist stop` detaches it first.")
        ref = args.pool
        if ref is None:
            running = [st.name or st.id for st in session_mod.running_pools()]
            if len(running) != 1:
                raise UsageError(f"name the pool to attach to: `%dist attach NAME`; running pools: "
                                 f"{', '.join(running) or 'none'}.")
            ref = running[0]
        try:
            s = Session.attach(ref, on=args.on)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print(f"attached to pool {s.name} ({s.pool_id}): {ranks_text(s.world_size)}, backend {s.backend}; "
              + _notebooks(s))
        if s.home is not None:
            print(f"sub-mesh {s.home} (ranks {format_ranks(s.meshes[s.home])}) is this notebook's: its "
                  "cells, pushes and pulls go there.")
        print(format_table(s.status(), _columns(s)))

    def _dist_status(self, args):
        s = session_mod.current_or_none()
        if s is None:
            running = session_mod.running_pools()
            # a running pool first: after a kernel restart it is the one this notebook kept
            print("this notebook drives no pool: "
                  + "".join(f"`%dist attach {st.name or st.id}` ({ranks_text(st.n)}"
                            + (", kept by the Jupyter server" if st.config.keep else "") + ")\n  or "
                            for st in running)
                  + "start one with `%dist start -n 2`")
            _sidebar_note()
            return
        rows = s.status()
        print(f"pool {s.name} ({s.pool_id}): {ranks_text(s.world_size)}, backend {s.backend}, launcher "
              f"{s.config.launcher}; {_notebooks(s)}")
        if _where(s):
            print(_where(s))
        print(format_table(rows, _columns(s)))
        for line in started_lines({r["rank"]: r.get("started") for r in rows if r["rank"] != "-"}):
            print(line)
        print(s.group_state())
        _sidebar_note()

    def _dist_stop(self, args):
        s = session_mod.current_or_none()
        if s is None:
            print("this notebook drives no pool.")
            return
        n, name = s.world_size, s.name
        others = [c["notebook"] for c in s.notebooks() if c["pid"] != os.getpid()]
        if s.attached and not args.everyone:
            kept = s.config.keep
            s.detach()
            print(f"detached from pool {name}; "
                  + (f"the Jupyter server keeps it (`%dist attach {name}` takes it back)" if kept else
                     "it keeps running")
                  + (f" for {', '.join(others)}" if others else "")
                  + ". `%dist stop --all` stops it for everyone (the JupyterLab sidebar's Stop asks first).")
            return
        s.stop(everyone=True)
        print(f"stopped pool {name} ({ranks_text(n)}); no process of it is left."
              + (f" It was also driven by {', '.join(others)}: they are told at their next cell." if others
                 else ""))

    def _dist_restart(self, args):
        s = self._session("%dist restart")
        try:
            restarted = s.restart(progress=print)
        except ValueError as exc:  # the launcher cannot start them (MPI, Slurm), or no host answers
            raise UsageError(str(exc)) from None
        what = f"restarted rank {', '.join(map(str, restarted))}" if restarted else "no rank was dead"
        print(f"{what}; the process group is re-formed.")
        print(format_table(s.status(), _columns(s)))

    def _dist_scale(self, args):
        s = self._session("%dist scale")
        before = s.world_size
        try:
            s.scale(args.n, progress=print)
        except ValueError as exc:  # e.g. more ranks than this machine holds: nothing was started
            raise UsageError(str(exc)) from None
        print(f"scaled from {before} to {ranks_text(s.world_size)}; the process group is re-formed "
              "(resume training from its checkpoint at the new world size).")
        print(f"── the outputs above this line come from the world of {ranks_text(before)} ──")
        print(format_table(s.status(), _columns(s)))

    def _dist_split(self, args):
        s = self._session("%dist split")
        try:
            plan = s.split(args.sizes, names=args.names.split(",") if args.names else None)
        except ValueError as exc:  # sizes that do not add up, names twice: nothing was changed
            raise UsageError(str(exc)) from None
        print("split into " + ", ".join(f"{name} (ranks {format_ranks(ranks)}, world size {len(ranks)})"
                                        for name, ranks in plan.items())
              + f"; run on one with `%%distributed --on {next(iter(plan))}`; `%dist join` makes one group "
              "again.")

    def _dist_join(self, args):
        s = self._session("%dist join")
        if not s.meshes:
            print(f"the pool is one process group already ({ranks_text(s.world_size)}).")
            return
        try:
            s.join()
        except ValueError as exc:  # a notebook handed one sub-mesh: the pool's own notebook joins it
            raise UsageError(str(exc)) from None
        print(f"joined: one process group of {ranks_text(s.world_size)} (backend {s.backend}).")

    def _dist_check(self, args):
        from workbench.preflight import run_check

        s = self._session("%dist check")
        report = run_check(s, size_mb=args.size_mb)
        print(report.format())
        return None

    def _dist_stacks(self, args):
        s = self._session("%dist stacks")
        ranks = self._targets(s, args.ranks, args.on)
        try:
            found = s.stacks(ranks=ranks, native=args.native)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print(found.format())

    def _dist_debug(self, args):
        s = self._session("%dist debug")
        self._targets(s, [args.rank])
        try:
            found = s.debug(args.rank, frame=args.frame, expr=args.expr)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print(found if isinstance(found, str) else found.format())

    def _dist_push(self, args):
        s = self._session("%dist push")
        missing = [n for n in args.names if n not in self.shell.user_ns]
        if missing:
            raise UsageError(f"not defined in the notebook: {', '.join(missing)}. Define them, then push.")
        ranks = self._targets(s, args.ranks, args.on)
        try:
            s.push({n: self.shell.user_ns[n] for n in args.names}, ranks=ranks)
        except ValueError as exc:  # a value pickle refuses
            raise UsageError(str(exc)) from None

    def _dist_pull(self, args):
        s = self._session("%dist pull")
        if args.rank is not None or args.on is not None:
            self._targets(s, None if args.rank is None else [args.rank], args.on)
        try:
            value = s.pull(args.name, rank=args.rank, on=args.on)
        except NameError as exc:
            raise UsageError(str(exc)) from None
        self.shell.user_ns[args.name] = value
        return value

    def _dist_auto(self, args):
        if args.mode == "on":
            self._session("%dist auto on")
        self.auto(args.mode == "on")
        print(f"auto mode {args.mode}: " + (
            "every cell runs on all ranks; start a cell with %%local to run it here."
            if args.mode == "on" else "cells run in the notebook again."))

    def auto(self, on: bool) -> None:
        transformers = self.shell.input_transformers_cleanup
        if on and not self._auto_on:
            transformers.append(self._auto_transform)
        elif not on and self._auto_on:
            transformers.remove(self._auto_transform)
        self._auto_on = on

    def _auto_transform(self, lines: list[str]) -> list[str]:
        first = next((ln.strip() for ln in lines if ln.strip()), "")
        if self._running_local or not first or first.startswith(("%%", "%dist")):
            return lines
        return ["%%distributed\n", *lines]

    def _dist_run(self, args):
        """``%dist run script.py [--ranks R] [--timeout S] [--quiet] -- args``: a torchrun script as it is."""
        s = self._session("%dist run")
        ranks = self._targets(s, args.ranks, args.on)
        spread_numbers = lines.wanted(None, len(ranks))
        merger = None if args.quiet else _merger(s, ranks, spread_numbers)
        on_output = _rank_output(merger)

        try:
            result = s.run_script(args.script, args.script_args, ranks=ranks, timeout=args.timeout,
                                  on_output=on_output, on_tick=merger.poll if merger else None,
                                  spread=spread_numbers)
        except (FileNotFoundError, ValueError) as exc:  # nothing was sent
            raise UsageError(str(exc)) from None
        except SyntaxError as exc:
            raise UsageError(_syntax_error(exc, args.script)) from None
        except (RankError, CellInterrupted, CellTimeout) as exc:
            if merger:
                merger.close()  # the ranks' last lines before the tabs
            if exc.result is not None:
                _show_ranks(exc.result, s.world_size)
            raise
        finally:
            if merger:
                merger.close()
        _show_ranks(result, s.world_size)

    def _targets(self, s: Session, ranks, on: str | None = None):
        try:
            return [r.rank for r in s.targets(ranks, on)]
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    # -- %%distributed -------------------------------------------------------------------
    @cell_magic
    def distributed(self, line: str, cell: str):
        """Run the cell on every rank at once:
        ``%%distributed [--ranks 0,2-3] [--on SUBMESH] [--timeout S] [--quiet] [--spread | --no-spread]
        [--monitor] [--async]``.

        Names ready on every rank: ``rank``, ``local_rank``, ``world_size``, ``device``, ``dist``.
        """
        args = parse_cell(line)
        s = self._session("%%distributed")
        ranks = self._targets(s, args.ranks, args.on)
        spread_numbers = lines.wanted(args.spread, len(ranks))
        merger = None if args.quiet else _merger(s, ranks, spread_numbers)
        on_output = _rank_output(merger)

        from workbench.widgets.cell_monitor import monitor_cell, submit_cell  # live dashboard (issue 4)

        monitor = monitor_cell(s, always=args.monitor or args.async_,  # hidden until a Trainer runs
                               ranks=ranks if s.meshes else None)  # split: its sub-mesh's run

        def on_tick():  # every 0.05 s: lines held for identical ones are due, the dashboard
            if merger is not None:
                merger.poll()
            monitor.tick()

        if args.async_:
            return submit_cell(s, cell, ranks=ranks, timeout=args.timeout, monitor=monitor)
        try:
            result = s.run(cell, ranks=ranks, timeout=args.timeout, on_output=on_output, on_tick=on_tick,
                           spread=spread_numbers)
        except SyntaxError as exc:  # found here: nothing was sent
            raise UsageError(_syntax_error(exc, "the cell")) from None
        except (RankError, CellInterrupted, CellTimeout) as exc:
            monitor.finish(exc)
            if merger:
                merger.close()
            if exc.result is not None:
                _show_results(exc.result)
                _show_ranks(exc.result, s.world_size)
            raise
        finally:
            monitor.finish(sys.exc_info()[1])  # Ctrl-C: the dashboard says "interrupted"
            if merger:
                merger.close()
        _show_results(result)
        _show_ranks(result, s.world_size)

    @cell_magic
    def local(self, line: str, cell: str):
        """Run this cell in the notebook's own kernel (useful while ``%dist auto on``)."""
        self._running_local = True
        try:
            self.shell.run_cell(cell, store_history=False)
        finally:
            self._running_local = False


def _columns(s: Session) -> list[str]:
    """The status table's columns: which sub-mesh each rank is in, after its rank, once the pool is split."""
    return [STATUS_COLUMNS[0], "mesh", *STATUS_COLUMNS[1:]] if s.meshes else STATUS_COLUMNS


def _merger(s: Session, ranks: list[int], spread_numbers: bool) -> LineMerger:
    """The merger of a cell's lines: over its ranks' text, or over its hosts' lines where each host's hub
    merged its own ranks' (the kernel then merges the hosts')."""
    return LineMerger(ranks, print_stream, hold=lines.hold_for(len(ranks)), spread_numbers=spread_numbers,
                      units=s.hubs(ranks))


def _rank_output(merger: LineMerger | None):
    """What to do with a rank's output as it comes: displays shown under their rank, text merged (a host's
    lines, merged by its hub, merged again with the other hosts')."""
    def on_output(rank, kind, payload):
        if kind == "display":
            print(f"[rank {rank}]")
            publish_display_data(payload.get("data", {}), payload.get("metadata", {}))
        elif merger is not None and kind == "lines":
            stream, lines = payload
            merger.feed_lines(rank, stream, lines)
        elif merger is not None:
            merger.feed(rank, kind, payload)
    return on_output


def _syntax_error(exc: SyntaxError, where: str) -> str:
    """One line for a syntax error found in the kernel: where, what, the line itself."""
    text = (exc.text or "").strip()
    return (f"syntax error in {where}, line {exc.lineno}: {exc.msg}" + (f": {text}" if text else "")
            + "; nothing was sent to the ranks.")


def _notebooks(s: Session) -> str:
    """"notebooks: a.ipynb (started it), b.ipynb": who drives the pool; a kept pool's starter is the Jupyter
    server that keeps it (not "the JupyterLab panel": the notebook that asked for it is among the others)."""
    kept = s.config.keep
    names = [("the Jupyter server (keeps it)" if kept else f"{c['notebook']} (started it)")
             if c["role"] == "started" else c["notebook"] for c in s.notebooks()]
    return "notebooks: " + (", ".join(names) or "none here (started from the JupyterLab panel)")


def _driven() -> Session | None:
    """The session this notebook drives, if its pool still runs: one stopped elsewhere (the panel, another
    notebook, its lease) is said in its one line and let go of, so a new start or attach goes ahead."""
    s = session_mod.current_or_none()
    if s is None:
        return None
    try:
        s.check()
    except PoolGone as exc:
        print(f"workbench: {exc}")
        return None
    return s


def _show_ranks(result, world_size: int) -> None:
    """Beside the merged lines, a tab per rank when a rank failed or the output is long."""
    if rank_tabs.wanted(result):
        publish_display_data(rank_tabs.rank_tabs(result, world_size))


def _show_results(result) -> None:
    """Each rank's last-expression value; identical plain-text values shown once."""
    values = [(r.rank.rank, r.result) for r in result.ranks if r.result]
    if not values:
        return
    texts = {v.get("text/plain") for _, v in values}
    plain = all(len(v) == 1 for _, v in values)
    if len(values) > 1 and len(values) == len(result.ranks) and len(texts) == 1 and plain:
        label = f"[ranks {format_ranks([r for r, _ in values])}]"
        publish_display_data({"text/plain": f"{label} {texts.pop()}"})
        return
    for rank, bundle in values:
        if set(bundle) == {"text/plain"}:
            publish_display_data({"text/plain": f"[rank {rank}] {bundle['text/plain']}"})
        else:
            print(f"[rank {rank}]")
            publish_display_data(bundle)


def _where(s: Session) -> str:
    """The Slurm job the pool runs in and its time left ('' for none): ``inside Slurm job 12 (2 nodes, 8
    GPUs) · 1 h 23 min left``."""
    state = s.pool.state if s.pool is not None else None
    return allocation_words(state.allocation, state.ends) if state is not None else ""


def _sidebar_note() -> None:
    """Once per kernel: why the JupyterLab sidebar cannot work with the server that started this kernel
    (it lacks the workbench, or has another version); nothing when it can, or when no server started it."""
    from workbench.doctor import sidebar_note

    try:
        note = sidebar_note()
    except Exception as exc:  # a check of the set-up must never break the status
        note = f"(could not ask the Jupyter server about its workbench extension: {exc})"
    if note:
        print(note)
