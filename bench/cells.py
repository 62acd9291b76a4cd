"""Per-cell overhead of a trivial cell (``x = 1``) on 2 ranks, every variant interleaved in blocks.

In this process (an IPython ``InteractiveShell``, as the pool tests use): ``%%distributed``,
``Session.run``, raw ipyparallel ``DirectView.execute(block=True)`` and ``%%px`` on the same two
engines; nbdistributed's ``%%distributed`` in a shell of the anchors' environment, driven over a
pipe block by block. Through real ipykernels (jupyter_client): ``%%distributed`` and ``%%px`` in a
workbench kernel, nbdistributed's ``%%distributed`` in a kernel of the anchors' environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from bench.common import ANCHORS_PY, BENCH, ROOT, descendants, reap, shell, summary

TRIVIAL = "x = 1"


def _anchor_env() -> dict:
    # nbdistributed starts its workers as "python" from PATH: its own environment's python.
    return {
        **os.environ,
        "PATH": f"{ANCHORS_PY.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "GLOO_SOCKET_IFNAME": "lo",
    }


class AnchorServer:
    """``anchors_side.py serve`` in the anchors' environment: nbdistributed in a shell, over a pipe."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [str(ANCHORS_PY), str(BENCH / "anchors_side.py"), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=_anchor_env(),
            cwd=str(ROOT),
        )
        self.tree: dict = {}

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        for p in descendants(self.proc.pid):
            self.tree.setdefault(p.pid, p)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the anchors' process exited")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def close(self) -> int:
        try:
            if self.proc.poll() is None:
                self.ask(cmd="stop")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        import psutil

        try:
            self.tree.setdefault(self.proc.pid, psutil.Process(self.proc.pid))
        except psutil.NoSuchProcess:
            pass
        return reap(list(self.tree.values()))


def in_process(runs: int, block: int, anchors: bool) -> dict:
    from IPython.utils.capture import capture_output

    from workbench import session as session_mod

    ip = shell()
    notes: dict = {}
    with capture_output():
        ip.run_cell("%dist start -n 2")
    s = session_mod.current()
    view = s.client[[r.engine_id for r in s.ranks]]
    view.block = True
    view.activate()  # %%px on the same two engines
    server = None
    if anchors:
        try:
            server = AnchorServer()
            server.ask(cmd="start", n=2)
        except Exception as exc:
            notes["nbdistributed"] = f"could not run: {exc}"
            if server is not None:
                server.close()
            server = None

    def cell(code):
        def run():
            with capture_output():
                ip.run_cell(code)

        return run

    variants = {
        "workbench %%distributed": cell(f"%%distributed\n{TRIVIAL}"),
        "workbench Session.run": lambda: s.run(TRIVIAL),
        "ipyparallel DirectView.execute": lambda: view.execute(TRIVIAL, block=True),
        "ipyparallel %%px": cell(f"%%px\n{TRIVIAL}"),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    if server is not None:
        times["nbdistributed %%distributed"] = []
    try:
        for v in variants.values():  # warm-up: first-call imports and caches
            for _ in range(3):
                v()
        if server is not None:
            server.ask(cmd="cells", n=3)
        done = 0
        while done < runs:
            n = min(block, runs - done)
            for name, v in variants.items():
                for _ in range(n):
                    t0 = time.perf_counter()
                    v()
                    times[name].append(time.perf_counter() - t0)
            if server is not None:
                times["nbdistributed %%distributed"] += server.ask(cmd="cells", n=n)["times"]
            done += n
    finally:
        if server is not None:
            server.close()
        with capture_output():
            ip.run_cell("%dist stop")
    return {"results": {k: summary(v, 1e3, 2) for k, v in times.items()}, "unit": "ms", "notes": notes}


def through_kernels(runs: int, block: int, anchors: bool) -> dict:
    from bench.kernels import Kernel

    notes: dict = {}
    kernels: dict[str, Kernel] = {}
    variants: dict[str, tuple[str, str]] = {}
    try:
        wb = kernels["workbench"] = Kernel(sys.executable, "wb-bench", env={"GLOO_SOCKET_IFNAME": "lo"})
        wb.execute("%load_ext workbench")
        wb.execute("%dist start -n 2")
        wb.execute(
            "from workbench import session as _s\n_v = _s.current().client[[r.engine_id for r in "
            "_s.current().ranks]]\n_v.block = True\n_v.activate()"
        )
        variants["workbench %%distributed (ipykernel)"] = ("workbench", f"%%distributed\n{TRIVIAL}")
        variants["ipyparallel %%px (ipykernel)"] = ("workbench", f"%%px\n{TRIVIAL}")
        if anchors:
            try:
                nb = kernels["nbdistributed"] = Kernel(ANCHORS_PY, "nbd-bench", env=_anchor_env())
                nb.execute(
                    f"import sys\nsys.path.insert(0, {str(BENCH)!r})\nimport anchors_side\n"
                    "anchors_side.nbd_start(get_ipython(), 2)"
                )
                variants["nbdistributed %%distributed (ipykernel)"] = (
                    "nbdistributed",
                    f"%%distributed\n{TRIVIAL}",
                )
            except Exception as exc:
                notes["nbdistributed (ipykernel)"] = f"could not run: {exc}"
        times: dict[str, list[float]] = {k: [] for k in variants}
        for kernel, code in variants.values():
            for _ in range(3):
                kernels[kernel].execute(code)
        done = 0
        while done < runs:
            n = min(block, runs - done)
            for name, (kernel, code) in variants.items():
                for _ in range(n):
                    times[name].append(kernels[kernel].execute(code)[0])
            done += n
    finally:
        if "nbdistributed" in kernels:
            try:
                kernels["nbdistributed"].execute("anchors_side.nbd_stop(get_ipython())", check=False)
            except Exception:
                pass
        if "workbench" in kernels:
            try:
                kernels["workbench"].execute("%dist stop", check=False)
            except Exception:
                pass
        left = sum(k.shutdown() for k in kernels.values())
    return {
        "results": {k: summary(v, 1e3, 2) for k, v in times.items()},
        "unit": "ms",
        "notes": notes,
        "leftover": left,
    }


def run(runs: int = 200, block: int = 25, anchors: bool = True, kernels: bool = True) -> dict:
    out = {"in_process": in_process(runs, block, anchors)}
    if kernels:
        out["ipykernel"] = through_kernels(runs, block, anchors)
    return out
