import type { Dialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import {
  dialogFields,
  IInfo,
  IStartForm,
  IStartOption,
  IStartOptions,
  LAUNCHER,
  startRequest
} from './model';

/**
 * The "Advanced" start form, rendered from the server's description of the start options (`PoolConfig`'s
 * fields): the launcher first, then only the fields that launcher takes (they change with it), each
 * labelled as the panel's messages name it.
 */
export class StartForm extends Widget implements Dialog.IBodyWidget<IStartOptions> {
  constructor(
    info: IInfo | null,
    private readonly _form: IStartForm,
    initial: IStartOptions,
    error: string | null
  ) {
    super({ node: document.createElement('form') });
    this.addClass('wb-StartForm');
    this.node.innerHTML =
      (error
        ? `<p class="wb-StartForm-error" role="alert">${escape(error)}</p>`
        : '') +
      _form.options
        .filter(option => option.advanced)
        .map(
          option =>
            `<label data-field="${escape(option.name)}" title="${escape(option.help)}"><span>${escape(
              option.unit ? `${option.label} (${option.unit})` : option.label
            )}</span>${control(option, initial[option.name])}</label>`
        )
        .join('') +
      `<p class="wb-StartForm-hint">${
        info && info.gpus > 0
          ? `${info.gpus} GPU(s) on this machine: one engine per GPU.`
          : 'No GPU detected: engines run on CPU with gloo.'
      } ${escape(_form.note)}</p>`;
    this._launcher?.addEventListener('change', () => {
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
    return startRequest(this._form, fields);
  }

  private get _launcher(): HTMLSelectElement | null {
    return this.node.querySelector(`[name="${LAUNCHER}"]`);
  }

  /** Only the chosen launcher's fields (and those of every launcher) are shown. */
  private _showFields(): void {
    const launcher = this._launcher?.value ?? '';
    const shown = new Set(dialogFields(this._form, launcher).map(o => o.name));
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

/**
 * The control of one option, holding `value` (else its default): a select where it has choices (with an
 * empty first choice, its hint, where it may be left empty, and the value asked before if it is not one of
 * them), a box to tick for a switch, else a box to type in.
 */
function control(option: IStartOption, value: unknown): string {
  const name = escape(option.name);
  const given = value ?? option.default;
  const chosen = given === null || given === undefined ? '' : String(given);
  if (option.choices.length > 0) {
    const choices = [
      ...(option.default === null ? [{ value: '', label: option.hint ?? '' }] : []),
      ...option.choices,
      ...(chosen && !option.choices.some(c => c.value === chosen)
        ? [{ value: chosen, label: chosen }]
        : [])
    ];
    const options = choices
      .map(
        c =>
          `<option value="${escape(c.value)}"${c.value === chosen ? ' selected' : ''}>${escape(c.label)}</option>`
      )
      .join('');
    return `<select name="${name}" class="jp-mod-styled">${options}</select>`;
  }
  if (option.kind === 'switch') {
    return `<span class="wb-StartForm-check"><input name="${name}" type="checkbox" value="true"${
      given === true ? ' checked' : ''
    }><span>${escape(option.hint ?? '')}</span></span>`;
  }
  const inputmode =
    option.kind === 'count' ? 'numeric' : option.kind === 'seconds' ? 'decimal' : 'text';
  // a box shows what was asked before; empty, its hint (the default is the server's to apply)
  const typed = value === null || value === undefined ? '' : String(value);
  return `<input name="${name}" type="text" inputmode="${inputmode}" value="${escape(typed)}"
        placeholder="${escape(option.hint ?? '')}" class="jp-mod-styled">`;
}
