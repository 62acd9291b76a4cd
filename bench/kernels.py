"""Real ipykernels for the benchmarks, started with jupyter_client from a given Python.

>>> k = Kernel(sys.executable, "wb")            # doctest: +SKIP
>>> k.execute("%load_ext workbench")            # doctest: +SKIP
>>> k.shutdown()                                # doctest: +SKIP
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from bench.common import ROOT, descendants, reap


class KernelFailed(RuntimeError):
    pass


class Kernel:
    """An ipykernel of ``python`` (its own kernel spec in a temporary folder), with a blocking client."""

    def __init__(self, python, name: str, env: dict | None = None, timeout: float = 120):
        self.dir = Path(tempfile.mkdtemp(prefix="wb-bench-kernel-"))
        spec = self.dir / "kernels" / name
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "display_name": name,
                    "language": "python",
                    "env": dict(env or {}),
                }
            )
        )
        self.km = KernelManager(
            kernel_name=name, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(self.dir / "kernels")])
        )
        self.km.start_kernel(cwd=str(ROOT))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=timeout)
        self.pid = self.km.provisioner.pid if self.km.provisioner else None

    def execute(self, code: str, timeout: float = 300, check: bool = True) -> tuple[float, str]:
        """Run ``code``; (seconds from request to reply and idle, the text it printed)."""
        out: list[str] = []
        errors: list[str] = []

        def hook(msg):
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                errors.append(f"{content['ename']}: {content['evalue']}")

        t0 = time.perf_counter()
        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook, store_history=False)
        seconds = time.perf_counter() - t0
        if check and (reply["content"]["status"] != "ok" or errors):
            raise KernelFailed(f"the kernel failed running {code[:60]!r}: {errors or reply['content']}")
        return seconds, "".join(out)

    def shutdown(self) -> int:
        """Shut the kernel down; end (by pid) anything it left; how many processes had to be ended."""
        tree = descendants(self.pid) if self.pid else []
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=False)
        except Exception:
            pass
        left = reap(tree)
        shutil.rmtree(self.dir, ignore_errors=True)
        return left
