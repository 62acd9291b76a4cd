import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ISessionContextDialogs,
  MainAreaWidget,
  WidgetTracker
} from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { LabIcon } from '@jupyterlab/ui-components';

// The sidebar is added at activation, so its model and view load at once.
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { WorkbenchAPI } from './api';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import {
  attachSource,
  IPool,
  IStartOptions,
  PoolsModel,
  startFromDialog
} from './model';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { PoolsPanel } from './panel';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { DashboardPanel } from './dashboardPanel';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { PoolAwareSessionDialogs } from './dialogs';

const POOL_ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="2" y="3" width="9" height="7" rx="1.5"/><rect x="13" y="3" width="9" height="7" rx="1.5"/>
    <rect x="2" y="14" width="9" height="7" rx="1.5"/><rect x="13" y="14" width="9" height="7" rx="1.5"/>
  </g></svg>`;

export const poolIcon = new LabIcon({
  name: 'distributed-workbench:pool',
  svgstr: POOL_ICON_SVG
});

/** How long "Use in notebook" waits for the kernel to say whether it loaded the magics (a busy kernel
 * answers only after its cell: then the snippet loads them too, which at worst says "already loaded"). */
const ASK_KERNEL_MS = 1500;

/** Whether the notebook's kernel has loaded the workbench magics (asked silently, nothing in its
 * history; no answer in time, or no kernel: no). */
async function magicsLoaded(kernel: Kernel.IKernelConnection | null | undefined): Promise<boolean> {
  if (!kernel || kernel.status !== 'idle') {
    return false;
  }
  const future = kernel.requestExecute({
    code: '',
    silent: true,
    store_history: false,
    user_expressions: {
      workbench: "'workbench' in get_ipython().extension_manager.loaded"
    }
  });
  const late = new Promise<null>(resolve => setTimeout(() => resolve(null), ASK_KERNEL_MS));
  try {
    const reply = await Promise.race([future.done, late]);
    const found = (reply?.content as { user_expressions?: Record<string, unknown> } | undefined)
      ?.user_expressions?.workbench as { data?: Record<string, unknown> } | undefined;
    return found?.data?.['text/plain'] === 'True';
  } catch {
    return false;
  }
}

/** The attach snippet, inserted below the active cell of the current notebook. */
async function insertAttachCell(tracker: INotebookTracker, pool: IPool): Promise<void> {
  const panel = tracker.currentWidget;
  if (!panel || !pool.attach) {
    return;
  }
  // a workbench kernel has the magics loaded already; one still starting has no kernel object yet,
  // but the session knows which kernel it starts, and the notebook which it asks for; another kernel
  // is asked whether an earlier cell loaded them
  const context = panel.sessionContext;
  const spec = panel.content.model?.getMetadata('kernelspec') as { name?: string } | undefined;
  const kernel = context.session?.kernel;
  const loaded = await magicsLoaded(kernel);
  const source = attachSource(
    pool.attach,
    [kernel?.name, context.kernelPreference.name, spec?.name],
    loaded
  );
  NotebookActions.insertBelow(panel.content);
  const cell = panel.content.activeCell;
  if (cell) {
    cell.model.sharedModel.setSource(source);
  }
}

const OPEN_DASHBOARD = 'distributed-workbench:open-dashboard';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'distributed-workbench:pools',
  description: 'A sidebar with the distributed pools of this server.',
  autoStart: true,
  requires: [ILabShell],
  optional: [INotebookTracker, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    tracker: INotebookTracker | null,
    restorer: ILayoutRestorer | null
  ) => {
    const api = new WorkbenchAPI(app.serviceManager.serverSettings);
    const model = new PoolsModel(api);
    // the docked dashboards: one per pool, beside the notebook, restored after a page reload
    const dashboards = new WidgetTracker<MainAreaWidget<DashboardPanel>>({
      namespace: 'workbench-dashboard'
    });
    const openDashboard = (id: string, label: string) => {
      const open = dashboards.find(w => w.content.pool === id);
      if (open) {
        shell.activateById(open.id);
        return open;
      }
      const widget = new MainAreaWidget({
        content: new DashboardPanel(id, label, api)
      });
      widget.id = `workbench-dashboard-${id}`;
      widget.title.label = `Dashboard · ${label}`;
      widget.title.caption = `The live dashboard of pool ${label} (${id})`;
      widget.title.icon = poolIcon;
      widget.title.closable = true;
      const notebook = tracker?.currentWidget;
      shell.add(widget, 'main', {
        mode: 'split-right',
        ref: notebook && !notebook.isDisposed ? notebook.id : null
      });
      void dashboards.add(widget);
      shell.activateById(widget.id);
      return widget;
    };
    const guard = async (pool: IPool, action: 'Stop' | 'Restart') => {
      const { confirmPoolAction } = await import('./dialogs');
      return confirmPoolAction(pool, action);
    };
    // the Start dialog, asked again with the server's sentence while it refuses the values
    const startAdvanced = async (initial: IStartOptions = {}) => {
      const { askStartOptions } = await import('./dialogs');
      const form = await model.startForm(); // the fields, as the server describes them
      if (form === null) {
        return false;
      }
      return startFromDialog(
        model,
        (values, error) => askStartOptions(model.info, form, values, error),
        initial
      );
    };
    const panel = new PoolsPanel(model, {
      start: () => void model.start({}),
      startAdvanced: () => void startAdvanced(),
      stop: async pool => {
        // a pool still starting holds nothing of the person's yet: cancel at once
        if (pool.state === 'starting' || (await guard(pool, 'Stop'))) {
          await model.stop(pool.id);
        }
      },
      restart: async pool => {
        if (await guard(pool, 'Restart')) {
          await model.restart(pool.id);
        }
      },
      // the dialog again with the values the failed start had; the new start takes its card's place
      retry: async pool => {
        if (await startAdvanced(pool.options ?? {})) {
          await model.stop(pool.id);
        }
      },
      dismiss: pool => void model.stop(pool.id),
      useInNotebook: pool => void (tracker && insertAttachCell(tracker, pool)),
      canUseInNotebook: () => !!tracker?.currentWidget,
      openDashboard: pool =>
        void app.commands.execute(OPEN_DASHBOARD, {
          id: pool.id,
          label: pool.name ?? pool.id
        }),
      showStacks: async pool => {
        const { showStacks } = await import('./dialogs');
        await showStacks(pool, () => api.stacks(pool.id));
      }
    });
    panel.title.icon = poolIcon;
    shell.add(panel, 'left', { rank: 400 });
    // open again after a page reload if it was open
    restorer?.add(panel, 'workbench-pools');
    // "Use in notebook" depends on whether a notebook is open.
    tracker?.currentChanged.connect(() => panel.update());
    // a notebook whose kernel finished a cell may have started, used or stopped a pool: the panel
    // looks at once instead of showing the pool as it was until its next poll
    tracker?.widgetAdded.connect((_, notebook) => {
      let last = notebook.sessionContext.kernelDisplayStatus;
      notebook.sessionContext.statusChanged.connect((_, status) => {
        if (status === 'idle' && last !== 'idle') {
          model.notebookChanged();
        }
        last = status;
      });
    });

    app.commands.addCommand(OPEN_DASHBOARD, {
      label: args => `Open the dashboard of pool ${args.label ?? args.id}`,
      describedBy: {
        args: {
          type: 'object',
          properties: { id: { type: 'string' }, label: { type: 'string' } },
          required: ['id']
        }
      },
      execute: args =>
        openDashboard(String(args.id), String(args.label ?? args.id))
    });
    restorer?.restore(dashboards, {
      command: OPEN_DASHBOARD,
      args: w => ({ id: w.content.pool, label: w.content.label }),
      name: w => w.content.pool
    });

    app.commands.addCommand('distributed-workbench:start-pool', {
      label: 'Start a distributed pool',
      describedBy: { args: { type: 'object', properties: {} } },
      execute: () => model.start({})
    });
    app.commands.addCommand('distributed-workbench:show-pools', {
      label: 'Show distributed pools',
      describedBy: { args: { type: 'object', properties: {} } },
      execute: () => shell.activateById(panel.id)
    });
  }
};

/**
 * JupyterLab's kernel dialogs (in place of `@jupyterlab/apputils-extension:sessionDialogs`, which
 * package.json disables), whose restart says what becomes of the notebook's pool.
 */
const sessionDialogs: JupyterFrontEndPlugin<ISessionContextDialogs> = {
  id: 'distributed-workbench:session-dialogs',
  description:
    "The kernel dialogs; a restart says whether the notebook's pool and its ranks' variables stay.",
  provides: ISessionContextDialogs,
  optional: [ITranslator, ISettingRegistry],
  autoStart: true,
  activate: (
    app: JupyterFrontEnd,
    translator: ITranslator | null,
    settingRegistry: ISettingRegistry | null
  ): ISessionContextDialogs =>
    new PoolAwareSessionDialogs(new WorkbenchAPI(app.serviceManager.serverSettings), {
      translator: translator ?? nullTranslator,
      settingRegistry
    })
};

export default [plugin, sessionDialogs];
