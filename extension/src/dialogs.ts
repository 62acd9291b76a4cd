import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { IInfo, IPool, IStartOptions } from './model';

/** The "Advanced" start form: labelled fields with sensible defaults. */
class StartForm extends Widget implements Dialog.IBodyWidget<IStartOptions> {
  constructor(info: IInfo | null) {
    super({ node: document.createElement('form') });
    this.addClass('wb-StartForm');
    const n = info?.default_n ?? 2;
    const launchers = info?.launchers ?? ['local'];
    const backends = info?.backends ?? ['auto'];
    this.node.innerHTML = `
      <label>Engines (ranks)
        <input name="n" type="number" min="1" step="1" value="${n}" class="jp-mod-styled">
      </label>
      <label>Launcher
        <select name="launcher" class="jp-mod-styled">${options(launchers)}</select>
      </label>
      <label>Backend
        <select name="backend" class="jp-mod-styled">${options(backends)}</select>
      </label>
      <label>Start timeout (s)
        <input name="timeout" type="number" min="0.1" step="any" value="60" class="jp-mod-styled">
      </label>
      <p class="wb-StartForm-hint">${
        info && info.gpus > 0
          ? `${info.gpus} GPU(s) on this machine: one engine per GPU.`
          : 'No GPU detected: engines run on CPU with gloo.'
      }</p>`;
  }

  getValue(): IStartOptions {
    const field = (name: string) =>
      (this.node.querySelector(`[name="${name}"]`) as HTMLInputElement).value;
    return {
      n: parseInt(field('n'), 10),
      launcher: field('launcher'),
      backend: field('backend'),
      timeout: parseFloat(field('timeout'))
    };
  }
}

function options(values: string[]): string {
  return values.map(v => `<option value="${v}">${v}</option>`).join('');
}

/** Ask for the start options; `null` when cancelled. */
export async function askStartOptions(
  info: IInfo | null
): Promise<IStartOptions | null> {
  const result = await showDialog({
    title: 'Start a pool',
    body: new StartForm(info),
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
  const what =
    action === 'Stop'
      ? `This ends its ${pool.n} engines (${ranks}) and the controller. `
      : `This ends its ${pool.n} engines (${ranks}) and starts ${pool.n} new ones with a fresh process group. `;
  const result = await showDialog({
    title: `${action} pool ${pool.id}?`,
    body:
      what +
      'Notebooks attached to it lose the variables on its ranks' +
      (pool.owner.kind === 'kernel' ? ` (it was started by ${pool.owner.label}).` : '.'),
    buttons: [
      Dialog.cancelButton(),
      Dialog.warnButton({ label: `${action} pool` })
    ]
  });
  return result.button.accept;
}
