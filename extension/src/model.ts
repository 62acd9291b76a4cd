import { ISignal, Signal } from '@lumino/signaling';

/** One rank of a pool, as the server reports it. */
export interface IRank {
  rank: number;
  host: string;
  pid: number;
  device: string;
  local_rank: number;
  state: 'starting' | 'idle' | 'busy' | 'failed' | 'unknown';
  cpu_percent: number | null;
  memory_bytes: number | null;
  gpu_util: number | null;
  gpu_memory_bytes: number | null;
  gpu_memory_total_bytes: number | null;
}

/** One pool of this server (started from the panel or from any notebook). */
export interface IPool {
  id: string;
  /** For pools started from the panel: the id the start was answered with (stable across the start). */
  request_id: string | null;
  state: 'starting' | 'running' | 'stopping' | 'failed';
  n: number;
  engines_up: number;
  message: string;
  error: string | null;
  log: string[];
  launcher: string;
  backend: string | null;
  created: number;
  owner: { kind: 'server' | 'kernel' | 'process'; label: string };
  /** Handed to this server by a notebook (`%dist start --keep`): it outlives that notebook's kernel. */
  kept?: boolean;
  /** What people call it (`%dist attach NAME`); null while a panel start has no id yet. */
  name: string | null;
  /** Who drives it now: the notebook (or the panel) that started it first, then the attached ones. */
  notebooks: { notebook: string; role: 'started' | 'attached'; pid: number }[];
  ranks: IRank[];
  gpu_detected: boolean;
  attach: string | null;
  /** How this server started it (what Retry shows again); `null` for pools a notebook started. */
  options: IStartOptions | null;
}

/**
 * The attach snippet for a notebook whose kernel is (or will be) ``kernelNames[0]`` or the first one
 * known: the running kernel's name, else the one it is starting (the session's preference), else the
 * notebook's kernelspec. A workbench kernel has the magics loaded already, so it gets the attach line
 * only (a `%load_ext workbench` there prints "already loaded"); any other kernel gets both.
 */
export function attachSource(attach: string, kernelNames: (string | null | undefined)[]): string {
  const kernel = kernelNames.find(name => !!name) ?? '';
  if (!kernel.startsWith('workbench')) {
    return attach;
  }
  return attach
    .split('\n')
    .filter(line => !line.startsWith('%load_ext'))
    .join('\n');
}

/** The card's mark on a pool the server keeps for a notebook (`%dist start --keep`), and why; else null. */
export function keptBadge(pool: IPool): { text: string; title: string } | null {
  if (!pool.kept) {
    return null;
  }
  const name = pool.name ?? pool.id;
  return {
    text: 'kept by the server',
    title:
      "Kept by the Jupyter server: it outlives the notebook's kernel; after a restart " +
      `\`%dist attach ${name}\` takes it back. It stops with the server, or at its idle release.`
  };
}

/** The notebooks attached to a pool (beside the one that started it): `attached: a.ipynb, b.ipynb`. */
export function attachedText(pool: IPool): string {
  const attached = attachedNotebooks(pool);
  return attached.length ? `attached: ${attached.join(', ')}` : '';
}

/** What a Stop or Restart dialog adds about them: ": a.ipynb is attached and is told at the next cell." */
export function attachedWarning(pool: IPool): string {
  const names = attachedNotebooks(pool);
  if (!names.length) {
    return '.';
  }
  const one = names.length === 1;
  const list = one ? names[0] : `${names.slice(0, -1).join(', ')} and ${names[names.length - 1]}`;
  return `: ${list} ${one ? 'is' : 'are'} attached and ${one ? 'is' : 'are'} told at the next cell.`;
}

function attachedNotebooks(pool: IPool): string[] {
  return (pool.notebooks ?? []).filter(n => n.role === 'attached').map(n => n.notebook);
}

/** What the Start dialog offers. */
export interface IInfo {
  launchers: string[];
  backends: string[];
  gpus: number;
  default_n: number;
}

/** How to start a pool: the fields of the Start dialog (empty ones are left out). */
export interface IStartOptions {
  n?: number;
  launcher?: string;
  backend?: string;
  timeout?: number;
  nodes?: number;
  gpus_per_node?: number;
  partition?: string;
  time?: string;
  account?: string;
  hosts?: string;
  interface?: string;
  oversubscribe?: boolean;
}

/** A network interface of the server's machine. */
export interface IInterface {
  name: string;
  address: string;
  loopback: boolean;
}

/** The fields of the Start dialog each launcher has, besides launcher, backend and timeout. */
export const LAUNCHER_FIELDS: Record<string, (keyof IStartOptions)[]> = {
  local: ['n', 'oversubscribe'],
  slurm: ['n', 'nodes', 'gpus_per_node', 'partition', 'time', 'account', 'interface'],
  mpi: ['n', 'hosts', 'interface'],
  ssh: ['n', 'hosts', 'gpus_per_node', 'interface']
};

/** What each field is called in the dialog (and so in every sentence the panel shows). */
export const FIELD_LABELS: Record<keyof IStartOptions, string> = {
  n: 'Engines',
  launcher: 'Launcher',
  backend: 'Backend',
  timeout: 'Start timeout',
  nodes: 'Nodes',
  gpus_per_node: 'GPUs per node',
  partition: 'Partition',
  time: 'Time limit',
  account: 'Account',
  hosts: 'Hosts',
  interface: 'Interface',
  oversubscribe: 'Oversubscribe'
};

const NUMBER_FIELDS: (keyof IStartOptions)[] = ['n', 'timeout', 'nodes', 'gpus_per_node'];

/**
 * The start request for what the dialog's fields hold: only the fields of the chosen
 * launcher, empty ones left out; numbers as numbers (what is not one is sent as typed,
 * for the server to say what is wrong with it); a ticked box as `true`.
 */
export function startRequest(fields: Record<string, string>): IStartOptions {
  const launcher = fields.launcher || 'local';
  const keep: (keyof IStartOptions)[] = [
    'launcher',
    'backend',
    'timeout',
    ...(LAUNCHER_FIELDS[launcher] ?? [])
  ];
  const out: Record<string, string | number | boolean> = {};
  for (const key of keep) {
    const value = (fields[key] ?? '').trim();
    if (value === '') {
      continue;
    }
    const number = Number(value);
    out[key] =
      NUMBER_FIELDS.includes(key) && isFinite(number) ? number : value;
  }
  if (out.oversubscribe !== undefined) {
    out.oversubscribe = out.oversubscribe === 'true';
  }
  return out as IStartOptions;
}

// the command-line flags our messages may name -> the dialog's field
const FLAGS: Record<string, keyof IStartOptions> = {
  '-n': 'n',
  '--launcher': 'launcher',
  '--backend': 'backend',
  '--timeout': 'timeout',
  '--nodes': 'nodes',
  '--gpus-per-node': 'gpus_per_node',
  '--partition': 'partition',
  '--time': 'time',
  '--account': 'account',
  '--hosts': 'hosts',
  '--interface': 'interface',
  '--oversubscribe': 'oversubscribe'
};
// flags that take no value: the word after them is the sentence's
const SWITCHES = ['--oversubscribe'];

/**
 * A message from the server as a person reads it in the panel: no Python class name in
 * front (`PoolStartError: ...`), and the command-line flags of our own messages named as
 * the dialog's fields (`--interface eth0` -> `Interface “eth0”`).
 */
export function inWords(message: string): string {
  return message
    .replace(
      /^[ \t]*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception):[ \t]*/gm,
      ''
    )
    // what only code or the magics can do: the Python spelling, the panel-less address, a magic
    .replace(/ \(PoolConfig\([^)]*\)\)/g, '')
    .replace(/ or --address\b/g, '')
    .replace(/:\s*`?%dist [^`.\n]*`?/g, '')
    // a switch is a box in the dialog: ticked, not added
    .replace(/\badd (--oversubscribe)\b/g, 'tick $1')
    .replace(/(^|[\s(;:,])gpus-per-node\b/g, `$1${FIELD_LABELS.gpus_per_node}`)
    // a field named as the code spells it, where a sentence begins: "n must be at least 1" -> Engines
    .replace(
      /(^|[.;:]\s+)(n|nodes|timeout|time|partition|account|hosts|interface)(?= (?:must|is|should)\b)/g,
      (_, before: string, name: keyof IStartOptions) => `${before}${FIELD_LABELS[name]}`
    )
    .replace(
      /(^|[\s(;:,])(--[a-z][a-z-]*|-n)(?:[ =]([^\s(]+))?/g,
      (whole, before: string, flag: string, value: string | undefined) => {
        const field = FLAGS[flag];
        if (!field) {
          return whole;
        }
        const label = FIELD_LABELS[field];
        if (SWITCHES.includes(flag)) {
          return `${before}${label}${value === undefined ? '' : ` ${value}`}`;
        }
        // a value ends before the sentence's punctuation: "--hosts a,b." -> Hosts “a,b”.
        const [, bare, tail] = /^(.*?)([.,;:)]*)$/.exec(value ?? '') ?? [];
        return bare
          ? `${before}${label} “${bare}”${tail}`
          : `${before}${label}${tail ?? ''}`;
      }
    );
}

/** How many ranks are in each state, counted in one pass over the ranks. */
export type RankCounts = Record<IRank['state'], number>;

export function rankCounts(ranks: IRank[]): RankCounts {
  const counts: RankCounts = { failed: 0, busy: 0, idle: 0, starting: 0, unknown: 0 };
  for (const r of ranks) {
    counts[r.state] = (counts[r.state] ?? 0) + 1;
  }
  return counts;
}

/** The colour of a card's dot: amber for a running pool with a failed rank. */
export function poolHealth(pool: IPool, counts: RankCounts = rankCounts(pool.ranks)): IPool['state'] | 'degraded' {
  if (pool.state === 'running' && counts.failed > 0) {
    return 'degraded';
  }
  return pool.state;
}

/** The ranks as the table lists them: failed ones first (what people look for), then by rank. */
export function ranksInOrder(ranks: IRank[]): IRank[] {
  const failed = ranks.filter(r => r.state === 'failed');
  return failed.length ? [...failed, ...ranks.filter(r => r.state !== 'failed')] : ranks;
}

/** Up to this many ranks the table shows at once; more sit behind an expander. */
export const RANKS_SHOWN = 4;

/** The REST calls the model needs (the real one is `WorkbenchAPI`). */
export interface IWorkbenchAPI {
  info(): Promise<IInfo>;
  interfaces(): Promise<IInterface[]>;
  /** The pools; those `countOnly` names without per-rank CPU, memory and GPU figures (only states). */
  list(countOnly?: string[]): Promise<IPool[]>;
  start(options: IStartOptions): Promise<IPool>;
  stop(id: string): Promise<void>;
  restart(id: string): Promise<IPool>;
}

/** `starting · 1/2 engines`, `running`, `failed to start`: never more than is true. */
export function poolStatusText(pool: IPool): string {
  switch (pool.state) {
    case 'starting':
      return `starting · ${pool.engines_up}/${pool.n} engines`;
    case 'stopping':
      return 'stopping';
    case 'failed':
      return 'failed to start';
    default: {
      const failed = rankCounts(pool.ranks).failed;
      return failed > 0 ? `running · ${failed} of ${pool.n} ranks failed` : 'running';
    }
  }
}

/** `starting · 2/2 engines · forming the process group`: the counts, and the step when it says more. */
export function progressText(pool: IPool): string {
  const step = pool.message;
  const says = step && !/^(starting|engines up\b)/.test(step);
  return poolStatusText(pool) + (says ? ` · ${step}` : '');
}

/** `1 rank` or `64 ranks`. */
export function ranksWord(n: number): string {
  return `${n} rank${n === 1 ? '' : 's'}`;
}

/**
 * The ranks summed up: `64 ranks: 63 idle, 1 failed`, `2 ranks: all busy`, `1 rank: idle`
 * (the states in a fixed order, the failed ones last, where the eye ends).
 */
export function rankSummary(ranks: IRank[], counts: RankCounts = rankCounts(ranks)): string {
  const order: IRank['state'][] = ['busy', 'idle', 'starting', 'unknown', 'failed'];
  const present = order.filter(state => counts[state] > 0);
  if (present.length === 0) {
    return ranksWord(ranks.length);
  }
  if (present.length === 1) {
    const all = ranks.length === 1 ? '' : 'all ';
    return `${ranksWord(ranks.length)}: ${all}${present[0]}`;
  }
  return `${ranksWord(ranks.length)}: ${present.map(state => `${counts[state]} ${state}`).join(', ')}`;
}

/** `1.5 GiB`, `512 MiB`, or `–` where there is no figure. */
export function formatBytes(bytes: number | null): string {
  if (bytes === null || bytes === undefined || !isFinite(bytes)) {
    return '–';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value >= 100 || unit === 0 ? value.toFixed(0) : value.toFixed(1)} ${units[unit]}`;
}

/** `42%` or `–`. */
export function formatPercent(value: number | null): string {
  return value === null || value === undefined ? '–' : `${Math.round(value)}%`;
}

/** Seconds since `created` (a Unix time in seconds), for a pending pool counting up. */
export function elapsedSeconds(created: number, now: number = Date.now()): number {
  return Math.max(0, Math.floor(now / 1000 - created));
}

/** Polling periods: fast while visible and healthy, backing off on errors. */
export const POLL_MS = 1500;
export const MAX_BACKOFF_MS = 30000;
/** After a notebook's cell ended: the look after the first one, once the pool's books caught up. */
export const SETTLE_MS = 500;

/**
 * The pools of this server, refreshed by polling while the panel is visible.
 *
 * Polling backs off (doubling up to `MAX_BACKOFF_MS`) while the server answers
 * with errors, and stops altogether while the panel is hidden. The last error is
 * kept in `error` for the panel to show.
 */
export class PoolsModel {
  constructor(
    readonly api: IWorkbenchAPI,
    private readonly _pollMs: number = POLL_MS
  ) {}

  get pools(): IPool[] {
    return this._pools;
  }
  get info(): IInfo | null {
    return this._info;
  }
  /** The last error from the server, as a sentence for the person; `null` when all is well. */
  get error(): string | null {
    return this._error;
  }
  /** The last action (start, stop, restart) that failed, as the server said it; kept until dismissed. */
  get actionError(): string | null {
    return this._actionError;
  }
  dismissActionError(): void {
    this._actionError = null;
    this._changed.emit();
  }
  /** Whether the first listing has come back. */
  get loaded(): boolean {
    return this._loaded;
  }
  /** Milliseconds until the next poll (grows while the server answers with errors). */
  get delay(): number {
    return this._delay;
  }
  get visible(): boolean {
    return this._visible;
  }
  get changed(): ISignal<this, void> {
    return this._changed;
  }
  /** Ids of pools with an action in flight (stop, restart), so their buttons can wait. */
  get busy(): ReadonlySet<string> {
    return this._busy;
  }

  /** Whether the rank table of pool `id` is open (its expander; small pools show theirs always). */
  isExpanded(id: string): boolean {
    return this._expanded.has(id);
  }

  /** Open or close a pool's rank table; an opened one gets its figures at once. */
  setExpanded(id: string, open: boolean): void {
    if (open) {
      this._expanded.add(id);
    } else {
      this._expanded.delete(id);
    }
    this._changed.emit();
    if (open && this._visible) {
      void this.refresh();
    }
  }

  /**
   * The pools whose ranks the panel only counts (more than `RANKS_SHOWN`, expander closed): the
   * server need not measure each of their ranks for a table nobody sees. A pool not listed yet
   * is measured.
   */
  countOnly(): string[] {
    return this._pools
      .filter(p => p.ranks.length > RANKS_SHOWN && !this._expanded.has(p.id))
      .map(p => p.id);
  }

  /**
   * A notebook finished running something (its kernel went idle): it may have started, stopped or
   * used a pool, so look now rather than at the next poll. Calls that come while a look is on
   * the way make one more look after it, not one each.
   */
  notebookChanged(): void {
    if (!this._visible) {
      return;
    }
    // and once more soon after: the controller's books (which ranks are busy) and the pool's state
    // file (which ranks are left) catch up with the kernel a moment after its cell ended
    this._settle = true;
    if (this._inFlight) {
      this._again = true;
      return;
    }
    void this.refresh();
  }

  /** Show or hide: polling runs only while visible. */
  setVisible(visible: boolean): void {
    if (visible === this._visible) {
      return;
    }
    this._visible = visible;
    if (visible) {
      void this.refresh();
    } else {
      this._cancel();
    }
  }

  /** Fetch the pools now (and the dialog info once), then schedule the next poll. */
  async refresh(): Promise<void> {
    this._cancel();
    this._inFlight = true;
    try {
      if (this._info === null) {
        this._info = await this.api.info();
      }
      this._pools = await this.api.list(this.countOnly());
      this._loaded = true;
      this._error = null;
      this._delay = this._pollMs;
    } catch (error) {
      this._error = messageOf(error);
      this._delay = Math.min(
        MAX_BACKOFF_MS,
        Math.max(this._pollMs, this._delay * 2)
      );
    }
    this._inFlight = false;
    this._changed.emit();
    if (this._again && this._visible) {
      this._again = false;
      return this.refresh();
    }
    this._schedule();
  }

  async start(options: IStartOptions = {}): Promise<void> {
    await this._act(null, async () => {
      const pool = await this.api.start(options);
      this._pools = [...this._pools.filter(p => p.id !== pool.id), pool];
    });
  }

  /**
   * Start with what the dialog holds. Resolves with the server's sentence when it refused
   * the request (a 400: nothing was started), for the dialog to show; else `null`.
   */
  async tryStart(options: IStartOptions): Promise<string | null> {
    let refused: string | null = null;
    await this._act(null, async () => {
      try {
        const pool = await this.api.start(options);
        this._pools = [...this._pools.filter(p => p.id !== pool.id), pool];
      } catch (error) {
        if ((error as { status?: unknown })?.status !== 400) {
          throw error;
        }
        refused = inWords(messageOf(error));
      }
    });
    return refused;
  }

  /** The network interfaces of the server's machine (none when it cannot say). */
  async interfaces(): Promise<IInterface[]> {
    try {
      return await this.api.interfaces();
    } catch {
      return [];
    }
  }

  async stop(id: string): Promise<void> {
    await this._act(id, async () => {
      this._pools = this._pools.map(p =>
        p.id === id && p.state !== 'failed'
          ? { ...p, state: 'stopping', message: 'stopping' }
          : p
      );
      this._changed.emit();
      await this.api.stop(id);
      this._pools = this._pools.filter(p => p.id !== id);
    });
  }

  async restart(id: string): Promise<void> {
    await this._act(id, async () => {
      const pool = await this.api.restart(id);
      this._pools = [...this._pools.filter(p => p.id !== id), pool];
    });
  }

  dispose(): void {
    this._cancel();
    this._visible = false;
    Signal.clearData(this);
  }

  private async _act(
    id: string | null,
    action: () => Promise<void>
  ): Promise<void> {
    if (id !== null) {
      this._busy.add(id);
    }
    this._changed.emit();
    this._actionError = null;
    try {
      await action();
    } catch (error) {
      this._actionError = inWords(messageOf(error));
    } finally {
      if (id !== null) {
        this._busy.delete(id);
      }
      this._changed.emit();
    }
    if (this._visible) {
      await this.refresh();
    }
  }

  private _schedule(): void {
    if (this._visible && this._timer === null) {
      const delay = this._settle && this._error === null ? SETTLE_MS : this._delay;
      this._settle = false;
      this._timer = setTimeout(() => {
        this._timer = null;
        void this.refresh();
      }, delay);
    }
  }

  private _cancel(): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
  }

  private _pools: IPool[] = [];
  private _info: IInfo | null = null;
  private _error: string | null = null;
  private _actionError: string | null = null;
  private _loaded = false;
  private _visible = false;
  private _delay = 0;
  private _timer: ReturnType<typeof setTimeout> | null = null;
  private _busy = new Set<string>();
  private _expanded = new Set<string>();
  private _inFlight = false;
  private _again = false;
  private _settle = false;
  private _changed = new Signal<this, void>(this);
}

/** Asks for start options, showing `error` (the server's last refusal) if there is one. */
export type AskStartOptions = (
  initial: IStartOptions,
  error: string | null
) => Promise<IStartOptions | null>;

/**
 * The Start dialog's loop: ask, start, and while the server refuses the request ask again
 * with the same values and its sentence. Resolves `true` once a start was accepted,
 * `false` when the person cancelled.
 */
export async function startFromDialog(
  model: PoolsModel,
  ask: AskStartOptions,
  initial: IStartOptions = {}
): Promise<boolean> {
  let values = initial;
  let error: string | null = null;
  for (;;) {
    const options = await ask(values, error);
    if (options === null) {
      return false;
    }
    error = await model.tryStart(options);
    if (error === null) {
      return true;
    }
    values = options;
  }
}

function messageOf(error: unknown): string {
  if (error instanceof Error) {
    return error.message;
  }
  return String(error);
}

/** GET /workbench/pools/<id>/stacks: every rank's stacks, grouped by identical stacks. */
export interface IStacks {
  text: string;
  seconds: number;
  missing: number[];
  groups: { ranks: number[]; headline: string }[];
  native: string | null;
}
