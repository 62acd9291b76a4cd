import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import {
  attachedWarning,
  IInfo,
  IPool,
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
