import { ISignal, Signal } from '@lumino/signaling';

/** One rank of a pool, as the server reports it. */
export interface IRank {
  rank: number;
  host: string;
  pid: number;
  device: string;
  local_rank: number;
  state: 'starting' | 'idle' | 'busy' | 'failed' | 'unknown';
  /** The sub-mesh it is in (`%dist split`), or null where the pool is not split. */
  mesh?: string | null;
  cpu_percent: number | null;
  memory_bytes: number | null;
  gpu_util: number | null;
  gpu_memory_bytes: number | null;
  gpu_memory_total_bytes: number | null;
}

/** A sub-mesh of a split pool (`%dist split 2 2 --names a,b`): its own process group. */
export interface IMesh {
  name: string;
  ranks: number[];
  state: IRank['state'];
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
  /** Why the start failed, as the workbench says it anywhere (the card shows `problem`). */
  error: string | null;
  /** Why the start failed, in the panel's words, as its parts. */
  problem?: IProblem | null;
  log: string[];
  launcher: string;
  backend: string | null;
  /** The Slurm job it runs in and its time left (`inside Slurm job 12 (2 nodes, 8 GPUs) · 23 min left`). */
  slurm?: string | null;
  created: number;
  owner: { kind: 'server' | 'kernel' | 'process'; label: string };
  /** Handed to this server by a notebook (`%dist start --keep`): it outlives that notebook's kernel. */
  kept?: boolean;
  /** What people call it (`%dist attach NAME`); null while a panel start has no id yet. */
  name: string | null;
  /** Who drives it now: the notebook (or the panel) that started it first, then the attached ones. */
  notebooks: { notebook: string; role: 'started' | 'attached'; pid: number }[];
  ranks: IRank[];
  /** A split pool's sub-meshes, each with one state for its ranks (empty where the pool is whole). */
  meshes?: IMesh[];
  gpu_detected: boolean;
  attach: string | null;
  /** How this server started it (what Retry shows again); `null` for pools a notebook started. */
  options: IStartOptions | null;
}

/**
 * The attach snippet for a notebook whose kernel is (or will be) ``kernelNames[0]`` or the first one
 * known: the running kernel's name, else the one it is starting (the session's preference), else the
 * notebook's kernelspec. A workbench kernel has the magics loaded already, and so has one that said so
 * (``loaded``: it loaded them in an earlier cell): it gets the attach line only (a `%load_ext workbench`
 * there prints "already loaded"); any other kernel gets both.
 */
export function attachSource(
  attach: string,
  kernelNames: (string | null | undefined)[],
  loaded = false
): string {
  const kernel = kernelNames.find(name => !!name) ?? '';
  if (!kernel.startsWith('workbench') && !loaded) {
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

/**
 * What the card's Restart does, as its dialog says it. A pool this server drives restarts as `%dist restart`
 * does: new engines for its lost ranks only, then the process group re-formed, the other ranks keeping their
 * variables. A pool a notebook drives (the server has no hand on its ranks) is stopped and started again.
 */
export function restartWhat(pool: IPool): string {
  const ranks = pool.n === 1 ? 'rank 0' : `ranks 0-${pool.n - 1}`;
  if (pool.owner.kind === 'server') {
    const lost = (pool.ranks ?? []).filter(r => r.state === 'failed').map(r => r.rank);
    return lost.length
      ? `This starts a new engine for rank ${lost.join(', ')} and re-forms the process group; ` +
          'the other ranks keep their variables, as `%dist restart` does.'
      : 'Every rank runs: this re-forms the process group, and the ranks keep their variables, ' +
          'as `%dist restart` does.';
  }
  return (
    `This ends its ${pool.n} engines (${ranks}) and starts ${pool.n} new ones with a fresh process group, ` +
    `run by this server under the same name. Notebooks attached to it lose the variables on its ranks` +
    (pool.owner.kind === 'kernel' ? ` (it was started by ${pool.owner.label})` : '') +
    attachedWarning(pool)
  );
}

/**
 * What a kernel restart does to the pools the notebook at `path` (called `name`) drives, in the restart
 * dialog's words; null where it drives none (JupyterLab's own dialog then says it all). A pool the notebook
 * started goes with its kernel; a kept one (`%dist start --keep`) and one it attached to run on, their
 * ranks keeping their variables, which JupyterLab's "All variables will be lost" would deny.
 */
export function restartKernelWords(pools: IPool[], path: string, name: string): string | null {
  const base = path.split('/').pop();
  const role = (pool: IPool) =>
    pool.notebooks.find(n => n.notebook === path || n.notebook === base)?.role;
  const driven = pools.filter(p => p.state === 'running' && role(p));
  if (driven.length === 0) {
    return null;
  }
  const fates = driven.map(pool => {
    const label = pool.name ?? pool.id;
    const what = `pool ${label} (${ranksWord(pool.n)})`;
    return role(pool) === 'started' && !pool.kept
      ? `${what}, which this notebook started, stops with the kernel, its ranks' variables too`
      : `${what} keeps running and its ranks keep their variables: ` +
          `\`%dist attach ${label}\` in the restarted kernel takes it up again`;
  });
  return (
    `Do you want to restart the kernel of ${name}? The notebook's variables will be lost; ` +
    `${fates.join('; ')}.`
  );
}

/** What the server says about the Start button: the engines a start gets here, whether there are GPUs. */
export interface IInfo {
  launchers: string[];
  backends: string[];
  gpus: number;
  default_n: number;
}

/**
 * How to start a pool: the start options by name (`PoolConfig`'s fields), as the server's start
 * request takes them; empty ones left out.
 */
export type IStartOptions = Record<string, unknown>;

/** One start option as the server describes it (`GET /workbench/options`, made from `PoolConfig`). */
export interface IStartOption {
  name: string;
  /** What the dialog calls it, and so every sentence the panel shows. */
  label: string;
  unit: string | null;
  help: string;
  kind: 'count' | 'seconds' | 'switch' | 'text' | 'hosts' | 'mapping';
  /** The values to pick from (a select); none: typed. */
  choices: { value: string; label: string }[];
  default: unknown;
  /** What an empty box shows (beside a box to tick: what ticking it does). */
  hint: string | null;
  /** The launchers it applies to; none: every one. */
  launchers: string[];
  /** Offered in the start dialog ("Advanced…"). */
  advanced: boolean;
}

/** The start dialog as the server describes it: its fields in order, and the sentence under them. */
export interface IStartForm {
  options: IStartOption[];
  note: string;
}

/** The field whose value decides which others the dialog shows. */
export const LAUNCHER = 'launcher';

/** The dialog's fields that apply to `launcher` (the launcher field itself included). */
export function dialogFields(form: IStartForm, launcher: string): IStartOption[] {
  return form.options.filter(
    o => o.advanced && (o.launchers.length === 0 || o.launchers.includes(launcher))
  );
}

/**
 * The start request for what the dialog's fields hold: only the fields of the chosen
 * launcher, empty ones left out; numbers as numbers (what is not one is sent as typed,
 * for the server to say what is wrong with it); a ticked box as `true`.
 */
export function startRequest(form: IStartForm, fields: Record<string, string>): IStartOptions {
  const launcher = fields[LAUNCHER] || String(form.options.find(o => o.name === LAUNCHER)?.default ?? '');
  const out: IStartOptions = {};
  for (const option of dialogFields(form, launcher)) {
    const value = (fields[option.name] ?? '').trim();
    if (value === '') {
      continue;
    }
    if (option.kind === 'switch') {
      if (value === 'true') {
        out[option.name] = true;
      }
      continue;
    }
    const number = Number(value);
    const numeric = option.kind === 'count' || option.kind === 'seconds';
    out[option.name] = numeric && isFinite(number) ? number : value;
  }
  return out;
}

/**
 * A failure as the server sends it, in the panel's words: what went wrong, the launcher's last
 * lines as it said them, the log's path, what to do.
 */
export interface IProblem {
  what: string;
  tail: string[];
  log: string | null;
  todo: string;
}

/** The problem an error carries (an answer of the server), else its message as the whole of it. */
export function problemOf(error: unknown): IProblem {
  const problem = (error as { problem?: IProblem | null } | null)?.problem;
  if (problem && typeof problem.what === 'string') {
    return problem;
  }
  return { what: messageOf(error), tail: [], log: null, todo: '' };
}

/** A problem as lines of text: what, the tail (`  | ` before each line), the log, what to do. */
export function problemText(problem: IProblem): string {
  return [
    problem.what,
    ...problem.tail.map(line => `  | ${line}`),
    problem.log ? `Log: ${problem.log}` : '',
    problem.todo
  ]
    .filter(line => line !== '')
    .join('\n');
}

/** A failed pool's problem (a server that sends none: its error, whole). */
export function poolProblem(pool: IPool): IProblem {
  return pool.problem ?? { what: pool.error ?? '', tail: [], log: null, todo: '' };
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
  /** The start dialog's fields (made on the server from `PoolConfig`'s). */
  startForm(): Promise<IStartForm>;
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

/** A rank list the way the magics write it: `0-2,5`. */
export function rangesText(ranks: number[]): string {
  const sorted = [...ranks].sort((a, b) => a - b);
  const parts: string[] = [];
  for (let i = 0; i < sorted.length; ) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) {
      j++;
    }
    parts.push(j > i ? `${sorted[i]}-${sorted[j]}` : `${sorted[i]}`);
    i = j + 1;
  }
  return parts.join(',');
}

/** One sub-mesh as the card says it: `a (ranks 0-1) busy`. */
export function meshText(mesh: IMesh): string {
  const word = mesh.ranks.length === 1 ? 'rank' : 'ranks';
  return `${mesh.name} (${word} ${rangesText(mesh.ranks)}) ${mesh.state}`;
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
  /** The last action (start, stop, restart) that failed, as the server said it to the panel; kept until
   * dismissed. */
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
        refused = problemText(problemOf(error));
      }
    });
    return refused;
  }

  /** The start dialog's fields; `null` (and the reason in `actionError`) when the server cannot say. */
  async startForm(): Promise<IStartForm | null> {
    try {
      return await this.api.startForm();
    } catch (error) {
      this._actionError = `The start dialog did not open: ${problemText(problemOf(error))}`;
      this._changed.emit();
      return null;
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
      this._actionError = problemText(problemOf(error));
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
