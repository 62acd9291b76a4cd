import {
  Dialog,
  ISessionContext,
  SessionContextDialogs,
  showDialog
} from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import {
  attachedWarning,
  IInfo,
  IPool,
  IWorkbenchAPI,
  restartKernelWords,
  restartWhat,
  IStartForm,
  IStartOptions
} from './model';
import { StartForm } from './startForm';

/**
 * Ask for the start options, showing the fields `initial` holds and, if the server
 * refused them, its sentence `error`; `null` when cancelled.
 */
export async function askStartOptions(
  info: IInfo | null,
  form: IStartForm,
  initial: IStartOptions = {},
  error: string | null = null
): Promise<IStartOptions | null> {
  const result = await showDialog({
    title: 'Start a pool',
    body: new StartForm(info, form, initial, error),
    buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Start' })]
  });
  return result.button.accept ? result.value : null;
}

/** Confirm a stop or restart, saying what it ends. */
export async function confirmPoolAction(
  pool: IPool,
  action: 'Stop' | 'Restart'
): Promise<boolean> {
  const ranks = pool.n === 1 ? 'rank 0' : `ranks 0-${pool.n - 1}`;
  const result = await showDialog({
    title: `${action} pool ${pool.name ?? pool.id}?`,
    body:
      action === 'Restart'
        ? restartWhat(pool)
        : `This ends its ${pool.n} engines (${ranks}) and the controller. ` +
          'Notebooks attached to it lose the variables on its ranks' +
          (pool.owner.kind === 'kernel' ? ` (it was started by ${pool.owner.label})` : '') +
          attachedWarning(pool),
    buttons: [
      Dialog.cancelButton(),
      Dialog.warnButton({ label: `${action} pool` })
    ]
  });
  return result.button.accept;
}

/** Every rank's stacks (the server's text, as `%dist stacks` prints it), or why they did not come. */
export async function showStacks(
  pool: IPool,
  fetch: () => Promise<{ text: string }>
): Promise<void> {
  const body = document.createElement('pre');
  body.className = 'wb-Stacks';
  try {
    body.textContent = (await fetch()).text;
  } catch (error) {
    body.textContent = `The stacks did not come: ${(error as Error).message}`;
  }
  const widget = new Widget({ node: body });
  await showDialog({
    title: `Stacks of pool ${pool.name ?? pool.id}`,
    body: widget,
    buttons: [Dialog.okButton({ label: 'Close' })]
  });
}

/**
 * JupyterLab's kernel dialogs, with a restart that says what becomes of the notebook's pool: a kept or
 * attached pool runs on, its ranks keeping their variables ("All variables will be lost" would say
 * otherwise); a notebook that drives no pool gets JupyterLab's own dialog and settings.
 */
export class PoolAwareSessionDialogs extends SessionContextDialogs {
  constructor(
    private readonly _api: IWorkbenchAPI,
    options: ISessionContext.IDialogsOptions = {}
  ) {
    super(options);
  }

  async restart(
    sessionContext: ISessionContext,
    options?: ISessionContext.IRestartOptions
  ): Promise<boolean> {
    let words: string | null = null;
    try {
      words = restartKernelWords(
        await this._api.list(),
        sessionContext.path,
        sessionContext.name
      );
    } catch {
      words = null; // the server gave no listing: JupyterLab's own dialog
    }
    const kernel = sessionContext.session?.kernel;
    if (words === null || !kernel) {
      return super.restart(sessionContext, options);
    }
    const result = await showDialog({
      title: 'Restart Kernel?',
      body: words,
      buttons: [
        Dialog.cancelButton({ ariaLabel: 'Cancel Kernel Restart' }),
        Dialog.warnButton({
          label: 'Restart',
          ariaLabel: 'Confirm Kernel Restart'
        })
      ]
    });
    if (kernel.isDisposed || !result.button.accept) {
      return false;
    }
    await sessionContext.restartKernel();
    return true;
  }
}
