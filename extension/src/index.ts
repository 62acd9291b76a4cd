import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';

// The sidebar is added at activation, so its model and view load at once.
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { WorkbenchAPI } from './api';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { IPool, IStartOptions, PoolsModel, startFromDialog } from './model';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { PoolsPanel } from './panel';

const POOL_ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="2" y="3" width="9" height="7" rx="1.5"/><rect x="13" y="3" width="9" height="7" rx="1.5"/>
    <rect x="2" y="14" width="9" height="7" rx="1.5"/><rect x="13" y="14" width="9" height="7" rx="1.5"/>
  </g></svg>`;

export const poolIcon = new LabIcon({
  name: 'distributed-workbench:pool',
  svgstr: POOL_ICON_SVG
});

/** The attach snippet, inserted below the active cell of the current notebook. */
function insertAttachCell(tracker: INotebookTracker, pool: IPool): void {
  const panel = tracker.currentWidget;
  if (!panel || !pool.attach) {
    return;
  }
  // a workbench kernel has the magics loaded already: only the attach line then
  const kernel = panel.sessionContext.session?.kernel?.name ?? '';
  const source = kernel.startsWith('workbench')
    ? pool.attach
        .split('\n')
        .filter(line => !line.startsWith('%load_ext'))
        .join('\n')
    : pool.attach;
  NotebookActions.insertBelow(panel.content);
  const cell = panel.content.activeCell;
  if (cell) {
    cell.model.sharedModel.setSource(source);
  }
}

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
    const model = new PoolsModel(
      new WorkbenchAPI(app.serviceManager.serverSettings)
    );
    const guard = async (pool: IPool, action: 'Stop' | 'Restart') => {
      const { confirmPoolAction } = await import('./dialogs');
      return confirmPoolAction(pool, action);
    };
    // the Start dialog, asked again with the server's sentence while it refuses the values
    const startAdvanced = async (initial: IStartOptions = {}) => {
      const { askStartOptions } = await import('./dialogs');
      const interfaces = await model.interfaces();
      return startFromDialog(
        model,
        (values, error) =>
          askStartOptions(model.info, interfaces, values, error),
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
      useInNotebook: pool => tracker && insertAttachCell(tracker, pool),
      canUseInNotebook: () => !!tracker?.currentWidget
    });
    panel.title.icon = poolIcon;
    shell.add(panel, 'left', { rank: 400 });
    // open again after a page reload if it was open
    restorer?.add(panel, 'workbench-pools');
    // "Use in notebook" depends on whether a notebook is open.
    tracker?.currentChanged.connect(() => panel.update());

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

export default plugin;
