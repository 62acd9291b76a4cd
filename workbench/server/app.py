"""The jupyter_server extension: the REST API the sidebar talks to."""

from __future__ import annotations

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float

from workbench.pool.records import sharing
from workbench.server.dashboards import IDLE_S
from workbench.server.handlers import handlers
from workbench.server.manager import PANEL, PoolManager


class WorkbenchServerExtension(ExtensionApp):
    """Serves ``/workbench/...``; stops the pools this server started when it shuts down."""

    name = "workbench"
    load_other_extensions = True
    dashboard_idle_s = Float(IDLE_S, config=True,
                             help="Seconds a docked dashboard refreshes after the last page asked "
                                  "(its pool's metrics are received all along).")

    def initialize_settings(self) -> None:
        self.manager = PoolManager(owners=self._kernel_owners, dashboard_idle_s=self.dashboard_idle_s)
        sharing.call_this_process(PANEL)  # what notebooks attached to a pool started here are told

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers(self.manager))

    async def _kernel_owners(self) -> dict[int, str]:
        """pid of each local kernel -> the notebook it runs for (so a card can say who owns a pool)."""
        km = self.serverapp.kernel_manager
        paths = {}
        try:
            for s in await self.serverapp.session_manager.list_sessions():
                if s.get("kernel"):
                    paths[s["kernel"]["id"]] = s.get("path") or s.get("name") or "a notebook"
        except Exception:
            pass
        out = {}
        for kid in km.list_kernel_ids():
            kernel = km.get_kernel(kid)
            prov = getattr(kernel, "provisioner", None)
            pid = getattr(prov, "pid", None) or getattr(getattr(prov, "process", None), "pid", None)
            if pid:
                out[pid] = paths.get(kid, f"kernel {kid[:8]}")
        return out

    async def stop_extension(self) -> None:
        await self.manager.shutdown()
