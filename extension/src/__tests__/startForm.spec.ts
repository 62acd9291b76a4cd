import { StartForm } from '../startForm';
import { IInfo } from '../model';
import { FORM, MARGIN } from './startForms';

const INFO: IInfo = { launchers: ['local'], backends: ['auto'], gpus: 0, default_n: 2 };

function shown(form: StartForm): string[] {
  return Array.from(form.node.querySelectorAll<HTMLElement>('[data-field]'))
    .filter(label => !label.hidden)
    .map(label => label.dataset.field ?? '');
}

function field(form: StartForm, name: string): HTMLInputElement {
  return form.node.querySelector(`[name="${name}"]`) as HTMLInputElement;
}

function pick(form: StartForm, name: string, value: string): void {
  const el = field(form, name);
  el.value = value;
  el.dispatchEvent(new Event('change'));
}

describe("the start dialog, rendered from the server's options", () => {
  it('labels each field as the server names it, and offers what it offers', () => {
    const form = new StartForm(INFO, FORM, {}, null);
    const labels = Array.from(form.node.querySelectorAll('[data-field] > span:first-child')).map(
      span => span.textContent
    );
    expect(labels).toEqual([
      'Launcher', 'Engines (ranks)', 'Hosts', 'Nodes', 'GPUs per node', 'Interface', 'Partition',
      'Time limit', 'Account', 'Backend', 'Start timeout (s)', 'Oversubscribe', 'Namespace', 'Image',
      'GPUs per pod', 'Pod template', 'Existing pods'
    ]);
    expect(shown(form)).toEqual(['launcher', 'n', 'backend', 'timeout', 'oversubscribe']);
    expect(field(form, 'launcher').value).toBe('local');
    expect(field(form, 'n').placeholder).toBe('default: 2 here, one per GPU on a cluster');
    expect(field(form, 'n').getAttribute('inputmode')).toBe('numeric');
    expect(field(form, 'timeout').placeholder).toBe('60');
    const interfaces = Array.from((field(form, 'interface') as unknown as HTMLSelectElement).options);
    expect(interfaces.map(o => [o.value, o.textContent])).toEqual([
      ['', 'none: loopback, this machine only'],
      ['lo', 'lo (127.0.0.1)'],
      ['eth0', 'eth0 (10.0.0.5)']
    ]);
    expect(form.node.querySelector('.wb-StartForm-hint')?.textContent).toBe(
      "No GPU detected: engines run on CPU with gloo. Interface: where engines on other machines reach " +
        "this server's pool."
    );
    pick(form, 'launcher', 'slurm');
    expect(shown(form)).toEqual([
      'launcher', 'n', 'nodes', 'gpus_per_node', 'interface', 'partition', 'time', 'account', 'backend',
      'timeout'
    ]);
    pick(form, 'launcher', 'kubernetes');
    expect(shown(form)).toEqual([
      'launcher', 'n', 'backend', 'timeout', 'namespace', 'image', 'gpus_per_pod', 'pod_template', 'pods'
    ]);
    form.dispose();
  });

  it('shows again what was asked, and the sentence the server refused it with', () => {
    const asked = { launcher: 'ssh', hosts: 'a,b', interface: 'ib9', timeout: 0.001, oversubscribe: true };
    const form = new StartForm(INFO, FORM, asked, 'Hosts “a,b” cannot reach this kernel.');
    expect(form.node.querySelector('.wb-StartForm-error')?.textContent).toBe(
      'Hosts “a,b” cannot reach this kernel.'
    );
    expect(field(form, 'launcher').value).toBe('ssh');
    expect(field(form, 'hosts').value).toBe('a,b');
    expect(field(form, 'timeout').value).toBe('0.001');
    expect(field(form, 'interface').value).toBe('ib9'); // not an interface of this machine: kept
    expect(field(form, 'oversubscribe').checked).toBe(true);
    expect(form.getValue()).toEqual({ launcher: 'ssh', hosts: 'a,b', interface: 'ib9', timeout: 0.001, backend: 'auto' });
    pick(form, 'launcher', 'mpi');
    expect(form.node.querySelector('.wb-StartForm-error')).toBeNull(); // it was about the other launcher
    form.dispose();
  });

  it('offers a field PoolConfig gains, with no change here', () => {
    const form = new StartForm(INFO, { ...FORM, options: [...FORM.options, MARGIN] }, {}, null);
    expect(shown(form)).not.toContain('walltime_margin');
    pick(form, 'launcher', 'slurm');
    expect(shown(form)).toContain('walltime_margin');
    const label = form.node.querySelector('[data-field="walltime_margin"]') as HTMLElement;
    expect(label.textContent).toBe('Walltime margin (s)');
    expect(label.title).toBe('seconds kept free before the allocation ends');
    expect(field(form, 'walltime_margin').placeholder).toBe('300');
    field(form, 'walltime_margin').value = '120';
    field(form, 'interface').value = 'lo';
    expect(form.getValue()).toEqual({
      launcher: 'slurm',
      interface: 'lo',
      backend: 'auto',
      walltime_margin: 120
    });
    form.dispose();
  });
});
