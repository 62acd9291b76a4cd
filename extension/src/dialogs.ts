import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import {
  attachedWarning,
  FIELD_LABELS,
  IInfo,
  IInterface,
  IPool,
  IStartOptions,
  LAUNCHER_FIELDS,
  startRequest
} from './model';

/** One labelled field of the form: `[name, label text, the control's HTML]`. */
type Field = [keyof IStartOptions, string, string];

/**
 * The "Advanced" start form: the launcher first, then only the fields that launcher takes
 * (they change with it), each labelled as the panel's messages name it.
 */
class StartForm extends Widget implements Dialog.IBodyWidget<IStartOptions> {
  constructor(
    info: IInfo | null,
    interfaces: IInterface[],
    initial: IStartOptions,
    error: string | null
  ) {
    super({ node: document.createElement('form') });
    this.addClass('wb-StartForm');
    const launchers = info?.launchers ?? ['local'];
    const backends = info?.backends ?? ['auto'];
    const value = (key: keyof IStartOptions) =>
      escape(String(initial[key] ?? ''));
    const text = (key: keyof IStartOptions, placeholder: string, kind = 'text') =>
      `<input name="${key}" type="text" inputmode="${kind}" value="${value(key)}"
        placeholder="${placeholder}" class="jp-mod-styled">`;
    const defaultN = info?.default_n ?? 2;
    const fields: Field[] = [
      ['launcher', FIELD_LABELS.launcher, select('launcher', launchers, initial.launcher ?? 'local')],
      ['n', `${FIELD_LABELS.n} (ranks)`, text('n', `default: ${defaultN} here, one per GPU on a cluster`, 'numeric')],
      ['hosts', FIELD_LABELS.hosts, text('hosts', 'node1,node2')],
      ['nodes', FIELD_LABELS.nodes, text('nodes', '1', 'numeric')],
      ['gpus_per_node', FIELD_LABELS.gpus_per_node, text('gpus_per_node', 'none: CPU engines', 'numeric')],
      ['interface', FIELD_LABELS.interface, interfaceSelect(interfaces, initial.interface ?? '')],
      ['partition', FIELD_LABELS.partition, text('partition', "the cluster's default")],
      ['time', FIELD_LABELS.time, text('time', 'e.g. 30, 2:00:00 or 1-00:00')],
      ['account', FIELD_LABELS.account, text('account', 'your default account')],
      ['backend', FIELD_LABELS.backend, select('backend', backends, initial.backend ?? 'auto')],
      ['timeout', `${FIELD_LABELS.timeout} (s)`, text('timeout', '60', 'decimal')],
      [
        'oversubscribe',
        FIELD_LABELS.oversubscribe,
        `<span class="wb-StartForm-check"><input name="oversubscribe" type="checkbox" value="true"${
          initial.oversubscribe ? ' checked' : ''
        }><span>more ranks than this machine holds</span></span>`
      ]
    ];
    this.node.innerHTML =
      (error
        ? `<p class="wb-StartForm-error" role="alert">${escape(error)}</p>`
        : '') +
      fields
        .map(
          ([key, label, control]) =>
            `<label data-field="${key}"><span>${label}</span>${control}</label>`
        )
        .join('') +
      `<p class="wb-StartForm-hint">${
        info && info.gpus > 0
          ? `${info.gpus} GPU(s) on this machine: one engine per GPU.`
          : 'No GPU detected: engines run on CPU with gloo.'
      } Interface: where engines on other machines reach this server's pool.</p>`;
    this._launcher.addEventListener('change', () => {
      // the sentence was about the other launcher's values
      this.node.querySelector('.wb-StartForm-error')?.remove();
      this._showFields();
    });
    this._showFields();
  }

  getValue(): IStartOptions {
    const fields: Record<string, string> = {};
    const controls = this.node.querySelectorAll<HTMLInputElement>('[name]');
    for (const el of Array.from(controls)) {
      fields[el.name] = el.type === 'checkbox' ? (el.checked ? 'true' : '') : el.value;
    }
    return startRequest(fields);
  }

  private get _launcher(): HTMLSelectElement {
    return this.node.querySelector('[name="launcher"]') as HTMLSelectElement;
  }

  /** Only the chosen launcher's fields (plus launcher, backend, timeout) are shown. */
  private _showFields(): void {
    const shown = new Set<string>([
      'launcher',
      'backend',
      'timeout',
      ...(LAUNCHER_FIELDS[this._launcher.value] ?? [])
    ]);
    const labels = this.node.querySelectorAll<HTMLElement>('[data-field]');
    for (const label of Array.from(labels)) {
      label.hidden = !shown.has(label.dataset.field ?? '');
    }
  }
}

function escape(text: string): string {
  const div = document.createElement('div');
  div.textContent = text;
  return div.innerHTML.replace(/"/g, '&quot;');
}

function select(name: string, values: string[], chosen: string): string {
  const options = values
    .map(
      v =>
        `<option value="${escape(v)}"${v === chosen ? ' selected' : ''}>${escape(v)}</option>`
    )
    .join('');
  return `<select name="${name}" class="jp-mod-styled">${options}</select>`;
}

/** The machine's interfaces, plus what was asked before if it is not one of them. */
function interfaceSelect(interfaces: IInterface[], chosen: string): string {
  const names = interfaces.map(i => i.name);
  const known = [
    ['', 'none: loopback, this machine only'],
    ...interfaces.map(i => [i.name, `${i.name} (${i.address})`]),
    ...(chosen && !names.includes(chosen) ? [[chosen, chosen]] : [])
  ];
  const options = known
    .map(
      ([v, label]) =>
        `<option value="${escape(v)}"${v === chosen ? ' selected' : ''}>${escape(label)}</option>`
    )
    .join('');
  return `<select name="interface" class="jp-mod-styled">${options}</select>`;
}

/**
 * Ask for the start options, showing the fields `initial` holds and, if the server
 * refused them, its sentence `error`; `null` when cancelled.
 */
export async function askStartOptions(
  info: IInfo | null,
  interfaces: IInterface[],
  initial: IStartOptions = {},
  error: string | null = null
): Promise<IStartOptions | null> {
  const result = await showDialog({
    title: 'Start a pool',
    body: new StartForm(info, interfaces, initial, error),
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
    title: `${action} pool ${pool.name ?? pool.id}?`,
    body:
      what +
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
