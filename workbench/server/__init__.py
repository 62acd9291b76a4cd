"""jupyter_server extension: authenticated REST over the pools of this server, under ``/workbench/``.

Enabled by ``etc/jupyter/jupyter_server_config.d/workbench.json`` (installed with the
package). Routes: :data:`workbench.server.handlers.ROUTES`.
"""


def _jupyter_server_extension_points():
    from workbench.server.app import WorkbenchServerExtension

    return [{"module": "workbench.server", "app": WorkbenchServerExtension}]
