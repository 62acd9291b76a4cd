import {
  attachSource,
  attachedText,
  attachedWarning,
  elapsedSeconds,
  formatBytes,
  formatPercent,
  dialogFields,
  IInfo,
  IPool,
  IRank,
  IStartForm,
  IStartOptions,
  IWorkbenchAPI,
  keptBadge,
  MAX_BACKOFF_MS,
  meshText,
  rangesText,
  SETTLE_MS,
  poolHealth,
  poolProblem,
  problemOf,
  problemText,
  restartKernelWords,
  restartWhat,
  PoolsModel,
  rankCounts,
  ranksInOrder,
  poolStatusText,
  progressText,
  rankSummary,
  startFromDialog,
  startRequest
} from '../model';
import { FORM, MARGIN } from './startForms';

function rank(r: number, state: IRank['state'] = 'idle'): IRank {
  return {
    rank: r,
    host: 'node0',
    pid: 100 + r,
    device: 'cpu',
    local_rank: r,
    state,
    cpu_percent: 1,
    memory_bytes: 1024,
    gpu_util: null,
    gpu_memory_bytes: null,
    gpu_memory_total_bytes: null
  };
}

function pool(overrides: Partial<IPool> = {}): IPool {
  return {
    id: 'abc123',
    request_id: null,
    state: 'running',
    n: 2,
    engines_up: 2,
    message: 'running',
    error: null,
    log: [],
    launcher: 'local',
    backend: 'gloo',
    created: 1000,
    owner: { kind: 'server', label: 'started from the panel' },
    name: 'pool-glad-heron',
    notebooks: [{ notebook: 'the JupyterLab panel', role: 'started', pid: 1 }],
    ranks: [rank(0), rank(1)],
    gpu_detected: false,
    attach: '%load_ext workbench\n%dist attach abc123',
    options: { n: 2, launcher: 'local', backend: 'auto', timeout: 60 },
    ...overrides
  };
}

const INFO: IInfo = {
  launchers: ['local'],
  backends: ['auto', 'gloo', 'nccl'],
  gpus: 0,
  default_n: 2
};

/** An error as the REST client throws it: the server's sentence, the HTTP status, and the problem. */
class HTTPError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly problem: unknown = null
  ) {
    super(message);
  }
}

/** An API whose answers the test sets, counting the calls. */
class FakeAPI implements IWorkbenchAPI {
  pools: IPool[] = [];
  failWith: Error | null = null;
  calls: string[] = [];
  async info(): Promise<IInfo> {
    this.calls.push('info');
    return INFO;
  }
  async startForm(): Promise<IStartForm> {
    if (this.failWith) {
      throw this.failWith;
    }
    return FORM;
  }
  countOnly: string[][] = [];
  async list(countOnly: string[] = []): Promise<IPool[]> {
    this.calls.push('list');
    this.countOnly.push(countOnly);
    if (this.failWith) {
      throw this.failWith;
    }
    return this.pools;
  }
  async start(options: IStartOptions): Promise<IPool> {
    this.calls.push(`start ${JSON.stringify(options)}`);
    if (this.failWith) {
      throw this.failWith;
    }
    return pool({
      id: 'new-1',
      state: 'starting',
      engines_up: 0,
      ranks: [],
      attach: null
    });
  }
  async stop(id: string): Promise<void> {
    this.calls.push(`stop ${id}`);
    if (this.failWith) {
      throw this.failWith;
    }
  }
  async restart(id: string): Promise<IPool> {
    this.calls.push(`restart ${id}`);
    return pool({ id: 'fresh', state: 'starting', engines_up: 0 });
  }
}

describe('text for people', () => {
  it('says how far a pending pool has got, never more', () => {
    expect(poolStatusText(pool({ state: 'starting', engines_up: 1 }))).toBe(
      'starting · 1/2 engines'
    );
    expect(poolStatusText(pool({ state: 'failed' }))).toBe('failed to start');
    expect(poolStatusText(pool())).toBe('running');
    expect(
      poolStatusText(pool({ ranks: [rank(0), rank(1, 'failed')] }))
    ).toBe('running · 1 of 2 ranks failed');
  });

  it('adds the step of a start when it says more than the counts', () => {
    const starting = pool({ state: 'starting', engines_up: 2 });
    expect(
      progressText({ ...starting, message: 'forming the process group' })
    ).toBe('starting · 2/2 engines · forming the process group');
    expect(progressText({ ...starting, message: 'engines up: 2/2' })).toBe(
      'starting · 2/2 engines'
    );
    expect(progressText({ ...starting, message: 'starting controller' })).toBe(
      'starting · 2/2 engines'
    );
  });

  it("says in the kernel's restart dialog what becomes of the notebook's pools", () => {
    const nb = (notebook: string, role: 'started' | 'attached') => [
      { notebook, role, pid: 1 }
    ];
    const kept = pool({ name: 'team', n: 2, kept: true, notebooks: nb('work/a.ipynb', 'attached') });
    const own = pool({ name: 'mine', n: 4, notebooks: nb('a.ipynb', 'started') });
    const other = pool({ name: 'theirs', notebooks: nb('b.ipynb', 'started') });
    expect(restartKernelWords([other], 'work/a.ipynb', 'a.ipynb')).toBeNull();
    expect(restartKernelWords([kept, other], 'work/a.ipynb', 'a.ipynb')).toBe(
      "Do you want to restart the kernel of a.ipynb? The notebook's variables will be lost; pool team " +
        '(2 ranks) keeps running and its ranks keep their variables: `%dist attach team` in the ' +
        'restarted kernel takes it up again.'
    );
    // matched by the notebook's name where the kernel knows only that; a pool it started goes with it
    expect(restartKernelWords([own], 'work/a.ipynb', 'a.ipynb')).toBe(
      "Do you want to restart the kernel of a.ipynb? The notebook's variables will be lost; pool mine " +
        "(4 ranks), which this notebook started, stops with the kernel, its ranks' variables too."
    );
    expect(
      restartKernelWords([{ ...own, state: 'stopping' }], 'a.ipynb', 'a.ipynb')
    ).toBeNull();
  });

  it('says a sub-mesh with its ranks as the magics write them: "a (ranks 0-1) busy"', () => {
    expect(rangesText([5, 0, 1, 2])).toBe('0-2,5');
    expect(meshText({ name: 'a', ranks: [0, 1], state: 'busy' })).toBe('a (ranks 0-1) busy');
    expect(meshText({ name: 'solo', ranks: [3], state: 'idle' })).toBe('solo (rank 3) idle');
  });

  it('summarises ranks by state in one line: "64 ranks: 63 idle, 1 failed"', () => {
    const big = [...Array(64).keys()].map(r => rank(r, r === 17 ? 'failed' : 'idle'));
    expect(rankSummary(big)).toBe('64 ranks: 63 idle, 1 failed');
    expect(rankSummary([rank(0, 'busy'), rank(1, 'failed'), rank(2)])).toBe(
      '3 ranks: 1 busy, 1 idle, 1 failed'
    );
    expect(rankSummary([rank(0), rank(1)])).toBe('2 ranks: all idle');
    // one rank is one rank (issue 24 item 9: "1 ranks")
    expect(rankSummary([rank(0)])).toBe('1 rank: idle');
    expect(rankCounts(big)).toEqual({ failed: 1, busy: 0, idle: 63, starting: 0, unknown: 0 });
  });

  it('lists the failed ranks first in the table', () => {
    const ranks = [rank(0), rank(1), rank(2, 'failed'), rank(3)];
    expect(ranksInOrder(ranks).map(r => r.rank)).toEqual([2, 0, 1, 3]);
  });

  it('says "degraded" beside the amber dot, not "running"', () => {
    const hurt = pool({ ranks: [rank(0), rank(1, 'failed')] });
    expect(poolHealth(hurt)).toBe('degraded');
    expect(poolHealth(pool())).toBe('running');
  });

  it('formats figures, with a dash where there is none', () => {
    expect(formatBytes(null)).toBe('–');
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1536 * 1024 * 1024)).toBe('1.5 GiB');
    expect(formatPercent(null)).toBe('–');
    expect(formatPercent(42.4)).toBe('42%');
    expect(elapsedSeconds(100, 103_500)).toBe(3);
    expect(elapsedSeconds(200, 100_000)).toBe(0);
  });
});

describe('the start dialog', () => {
  it('sends the fields of the chosen launcher only, numbers as numbers', () => {
    const fields = {
      launcher: 'slurm',
      backend: 'auto',
      timeout: '120',
      n: '',
      nodes: '2',
      gpus_per_node: '4',
      partition: ' gpu ',
      time: '2:00:00',
      account: '',
      hosts: 'left,over',
      interface: 'ib0'
    };
    expect(startRequest(FORM, fields)).toEqual({
      launcher: 'slurm',
      backend: 'auto',
      timeout: 120,
      nodes: 2,
      gpus_per_node: 4,
      partition: 'gpu',
      time: '2:00:00',
      interface: 'ib0'
    });
    expect(
      startRequest(FORM, { ...fields, launcher: 'ssh', hosts: 'a,b', nodes: '3' })
    ).toEqual({
      launcher: 'ssh',
      backend: 'auto',
      timeout: 120,
      gpus_per_node: 4,
      hosts: 'a,b',
      interface: 'ib0'
    });
    // not a number: sent as typed, for the server to say what is wrong with it
    expect(startRequest(FORM, { launcher: 'mpi', n: 'two' })).toEqual({
      launcher: 'mpi',
      n: 'two'
    });
    // a ticked box is true; an unticked one is left out
    expect(
      startRequest(FORM, { launcher: 'local', n: '9', oversubscribe: 'true' })
    ).toEqual({ launcher: 'local', n: 9, oversubscribe: true });
    expect(startRequest(FORM, { launcher: 'local', oversubscribe: '' })).toEqual({
      launcher: 'local'
    });
  });

  it('asks again with the same values and the sentence while the server refuses', async () => {
    const api = new FakeAPI();
    const model = new PoolsModel(api, 1000);
    const asked: [object, string | null][] = [];
    const answers = [
      { launcher: 'slurm', time: 'soon', interface: 'lo' },
      { launcher: 'slurm', time: '10', interface: 'lo' }
    ];
    const start = api.start.bind(api);
    api.start = async options => {
      if (options.time === 'soon') {
        throw new HTTPError("time 'soon' is not a Slurm time limit: write minutes ('30').", 400, {
          what: "Time limit 'soon' is not a Slurm time limit: write minutes ('30').",
          tail: [],
          log: null,
          todo: ''
        });
      }
      return start(options);
    };
    const ok = await startFromDialog(
      model,
      async (initial, error) => {
        asked.push([initial, error]);
        return answers.shift() ?? null;
      },
      { launcher: 'local', n: 2 }
    );
    expect(ok).toBe(true);
    expect(asked).toEqual([
      [{ launcher: 'local', n: 2 }, null],
      [
        { launcher: 'slurm', time: 'soon', interface: 'lo' },
        // the sentence the server wrote for the panel, as it came
        "Time limit 'soon' is not a Slurm time limit: write minutes ('30')."
      ]
    ]);
    // the refusal started nothing and is not a banner: the dialog said it
    expect(model.pools.map(p => p.state)).toEqual(['starting']);
    expect(model.actionError).toBeNull();
    model.dispose();
  });

  it('starts nothing when the person cancels', async () => {
    const api = new FakeAPI();
    const model = new PoolsModel(api, 1000);
    expect(await startFromDialog(model, async () => null)).toBe(false);
    expect(api.calls).toEqual([]);
    model.dispose();
  });

  it('keeps other failures of a start for the banner', async () => {
    const api = new FakeAPI();
    api.failWith = new HTTPError('could not reach the Jupyter server', 503);
    const model = new PoolsModel(api, 1000);
    expect(await model.tryStart({ n: 2 })).toBeNull();
    expect(model.actionError).toBe('could not reach the Jupyter server');
    // the dialog cannot open without its fields: the banner says why
    expect(await model.startForm()).toBeNull();
    expect(model.actionError).toBe(
      'The start dialog did not open: could not reach the Jupyter server'
    );
    model.dispose();
  });
});

describe('the start options, as the server describes them', () => {
  it('shows each launcher its own fields, in the order the server gives', () => {
    const names = (launcher: string) => dialogFields(FORM, launcher).map(o => o.name);
    expect(names('local')).toEqual(['launcher', 'n', 'backend', 'timeout', 'oversubscribe']);
    expect(names('slurm')).toEqual([
      'launcher', 'n', 'nodes', 'gpus_per_node', 'interface', 'partition', 'time', 'account',
      'backend', 'timeout'
    ]);
    expect(names('mpi')).toEqual(['launcher', 'n', 'hosts', 'interface', 'backend', 'timeout']);
    expect(names('ssh')).toEqual([
      'launcher', 'n', 'hosts', 'gpus_per_node', 'interface', 'backend', 'timeout'
    ]);
  });

  it('sends a field it was never told of, by its kind (a field added to PoolConfig)', () => {
    const form: IStartForm = { ...FORM, options: [...FORM.options, MARGIN] };
    expect(dialogFields(form, 'slurm').map(o => o.name)).toContain('walltime_margin');
    expect(dialogFields(form, 'local').map(o => o.name)).not.toContain('walltime_margin');
    expect(startRequest(form, { launcher: 'slurm', walltime_margin: '120', interface: 'lo' })).toEqual({
      launcher: 'slurm',
      walltime_margin: 120,
      interface: 'lo'
    });
    expect(startRequest(form, { launcher: 'local', walltime_margin: '120' })).toEqual({
      launcher: 'local'
    });
  });
});

describe('problems, as the server sends them', () => {
  const problem = {
    what: 'only 0 of 2 engines registered within 0.001 s:',
    tail: ['--- engine 0 ---', 'boom'],
    log: '/tmp/pool.log',
    todo: 'Try a longer Start timeout, or fewer engines. Every process started for the pool has been stopped.'
  };

  it('are shown as they came, one part a line', () => {
    expect(problemText(problem)).toBe(
      'only 0 of 2 engines registered within 0.001 s:\n  | --- engine 0 ---\n  | boom\n' +
        'Log: /tmp/pool.log\n' +
        'Try a longer Start timeout, or fewer engines. Every process started for the pool has been stopped.'
    );
    expect(problemText({ what: 'Engines must be at least 1 (got 0).', tail: [], log: null, todo: '' })).toBe(
      'Engines must be at least 1 (got 0).'
    );
  });

  it('come from the error, or are its message where the server sent none', () => {
    expect(problemOf(new HTTPError('--timeout', 400, problem))).toBe(problem);
    expect(problemOf(new HTTPError('could not reach the Jupyter server', 503))).toEqual({
      what: 'could not reach the Jupyter server',
      tail: [],
      log: null,
      todo: ''
    });
    // a failed pool: its problem; a server that sends none, its error whole (never rewritten here)
    expect(poolProblem(pool({ state: 'failed', problem }))).toBe(problem);
    expect(poolProblem(pool({ state: 'failed', error: 'PoolStartError: --timeout' })).what).toBe(
      'PoolStartError: --timeout'
    );
  });

  it('go on the banner as the server said them to the panel', async () => {
    const api = new FakeAPI();
    api.failWith = new HTTPError('pool abc is stopping: wait.', 409, { ...problem, tail: [], log: null });
    const model = new PoolsModel(api, 1000);
    await model.stop('abc');
    expect(model.actionError).toBe(problemText({ ...problem, tail: [], log: null }));
    model.dispose();
  });
  it('turns the dot amber when a rank of a running pool failed', () => {
    expect(poolHealth(pool())).toBe('running');
    expect(poolHealth(pool({ ranks: [rank(0), rank(1, 'failed')] }))).toBe(
      'degraded'
    );
    expect(poolHealth(pool({ state: 'failed', ranks: [] }))).toBe('failed');
  });
});

describe('PoolsModel', () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  async function flush(): Promise<void> {
    for (let i = 0; i < 5; i++) {
      await Promise.resolve();
    }
  }

  it('polls only while visible', async () => {
    const api = new FakeAPI();
    api.pools = [pool()];
    const model = new PoolsModel(api, 1000);
    let changes = 0;
    model.changed.connect(() => changes++);

    await jest.advanceTimersByTimeAsync(5000);
    expect(api.calls).toEqual([]); // hidden: nothing

    model.setVisible(true);
    await flush();
    expect(model.loaded).toBe(true);
    expect(model.pools.map(p => p.id)).toEqual(['abc123']);
    expect(model.info).toEqual(INFO);

    await jest.advanceTimersByTimeAsync(3000);
    expect(api.calls.filter(c => c === 'list').length).toBe(4);

    model.setVisible(false);
    const before = api.calls.length;
    await jest.advanceTimersByTimeAsync(10000);
    expect(api.calls.length).toBe(before);
    expect(changes).toBeGreaterThan(0);
    model.dispose();
  });

  it('keeps the server error for the person and backs off, then recovers', async () => {
    const api = new FakeAPI();
    api.failWith = new Error('the workbench server extension is not enabled');
    const model = new PoolsModel(api, 1000);
    model.setVisible(true);
    await flush();
    expect(model.error).toBe('the workbench server extension is not enabled');
    expect(model.delay).toBe(1000);
    await jest.advanceTimersByTimeAsync(1000);
    expect(model.delay).toBe(2000);
    await jest.advanceTimersByTimeAsync(2000);
    expect(model.delay).toBe(4000);
    for (let i = 0; i < 10; i++) {
      await jest.advanceTimersByTimeAsync(MAX_BACKOFF_MS);
    }
    expect(model.delay).toBe(MAX_BACKOFF_MS);

    api.failWith = null;
    await jest.advanceTimersByTimeAsync(MAX_BACKOFF_MS);
    expect(model.error).toBeNull();
    expect(model.delay).toBe(1000);
    model.dispose();
  });

  it('looks at once when a notebook finished a cell, not at the next poll (issue 24 item 8)', async () => {
    const api = new FakeAPI();
    api.pools = [pool({ state: 'starting', engines_up: 0, ranks: [] })];
    const model = new PoolsModel(api, 60_000);
    model.setVisible(true);
    await flush();
    expect(poolStatusText(model.pools[0])).toBe('starting · 0/2 engines');
    // the notebook printed "ready" and its cell ended: the panel says so without waiting a minute
    api.pools = [pool()];
    model.notebookChanged();
    await flush();
    expect(poolStatusText(model.pools[0])).toBe('running');
    // several cells ending while a look is on the way: one more look, not one each
    const before = api.calls.length;
    const looking = model.refresh();
    model.notebookChanged();
    model.notebookChanged();
    await looking;
    await flush();
    expect(api.calls.length - before).toBe(2);
    // and once more soon after, when the controller's books have caught up ("2 busy" after the cell)
    api.pools = [pool({ ranks: [rank(0, 'idle'), rank(1, 'failed')] })];
    await jest.advanceTimersByTimeAsync(SETTLE_MS);
    expect(poolStatusText(model.pools[0])).toBe('running · 1 of 2 ranks failed');
    model.dispose();
  });

  it('asks for no per-rank figures of a big pool whose table is closed (issue 25)', async () => {
    const api = new FakeAPI();
    const big = [...Array(64).keys()].map(r => rank(r));
    api.pools = [pool({ id: 'big', n: 64, ranks: big }), pool({ id: 'small' })];
    const model = new PoolsModel(api, 60_000);
    await model.refresh();
    await model.refresh();
    expect(api.countOnly[api.countOnly.length - 1]).toEqual(['big']);
    model.setVisible(true);
    model.setExpanded('big', true);
    await flush();
    expect(model.isExpanded('big')).toBe(true);
    expect(api.countOnly[api.countOnly.length - 1]).toEqual([]);
    model.dispose();
  });

  it('shows a started pool at once, as pending', async () => {
    const api = new FakeAPI();
    const model = new PoolsModel(api, 1000);
    await model.start({ n: 2 });
    expect(api.calls).toContain('start {"n":2}');
    expect(model.pools[0].state).toBe('starting');
    expect(poolStatusText(model.pools[0])).toBe('starting · 0/2 engines');
    model.dispose();
  });

  it('marks a pool stopping while the stop runs, then drops it', async () => {
    const api = new FakeAPI();
    api.pools = [pool()];
    const model = new PoolsModel(api, 1000);
    await model.refresh();
    const seen: string[] = [];
    model.changed.connect(() =>
      seen.push(`${model.pools[0]?.state}:${model.busy.has('abc123')}`)
    );
    api.pools = [];
    await model.stop('abc123');
    expect(seen).toContain('stopping:true');
    expect(model.pools).toEqual([]);
    expect(model.busy.size).toBe(0);
    model.dispose();
  });

  it('reports a failed action instead of swallowing it', async () => {
    const api = new FakeAPI();
    api.pools = [pool()];
    const model = new PoolsModel(api, 1000);
    await model.refresh();
    model.setVisible(true);
    await flush();
    api.failWith = new Error('pool abc123 is already stopping.');
    await model.stop('abc123');
    api.failWith = null;
    await jest.advanceTimersByTimeAsync(3000); // polls that succeed keep it
    expect(model.actionError).toBe('pool abc123 is already stopping.');
    expect(model.error).toBeNull();
    expect(model.busy.size).toBe(0);
    model.dismissActionError();
    expect(model.actionError).toBeNull();
    model.dispose();
  });
});

describe('attached notebooks', () => {
  it('are listed on the card and warned about before a stop', () => {
    const shared = pool({
      notebooks: [
        { notebook: 'train.ipynb', role: 'started', pid: 1 },
        { notebook: 'a.ipynb', role: 'attached', pid: 2 },
        { notebook: 'b.ipynb', role: 'attached', pid: 3 }
      ]
    });
    expect(attachedText(shared)).toBe('attached: a.ipynb, b.ipynb');
    expect(attachedWarning(shared)).toBe(': a.ipynb and b.ipynb are attached and are told at the next cell.');
    expect(attachedText(pool())).toBe('');
    expect(attachedWarning(pool())).toBe('.');
  });
});

describe('attachSource', () => {
  const attach = '%load_ext workbench\n%dist attach pool-brisk-tapir';
  it('gives a workbench kernel the attach line only, also while it is still starting', () => {
    expect(attachSource(attach, ['workbench-cpu'])).toBe('%dist attach pool-brisk-tapir');
    // no kernel object yet: the session's preference says which kernel is starting
    expect(attachSource(attach, [undefined, 'workbench-gpu', 'python3'])).toBe(
      '%dist attach pool-brisk-tapir'
    );
    expect(attachSource(attach, [null, undefined, 'workbench-cpu'])).toBe(
      '%dist attach pool-brisk-tapir'
    );
  });
  it('gives any other kernel the load line too', () => {
    expect(attachSource(attach, ['python3', 'workbench-cpu'])).toBe(attach);
    expect(attachSource(attach, [undefined, undefined, undefined])).toBe(attach);
  });
  it('gives a kernel that loaded the magics already the attach line only', () => {
    expect(attachSource(attach, ['python3'], true)).toBe('%dist attach pool-brisk-tapir');
    expect(attachSource(attach, ['python3'], false)).toBe(attach);
  });
});

describe('keptBadge', () => {
  it('marks a pool the server keeps for a notebook, saying how to take it back', () => {
    const badge = keptBadge(
      pool({ kept: true, owner: { kind: 'server', label: 'kept by the server' } })
    );
    expect(badge?.text).toBe('kept by the server');
    expect(badge?.title).toContain('`%dist attach pool-glad-heron` takes it back');
    expect(badge?.title).toContain('stops with the server');
  });

  it('leaves other pools unmarked (and servers that do not say)', () => {
    expect(keptBadge(pool({ kept: false }))).toBeNull();
    expect(keptBadge(pool())).toBeNull();
  });
});

describe('restartWhat', () => {
  const pool = (over: Partial<IPool>): IPool =>
    ({
      id: 'abc123',
      name: 'team',
      state: 'running',
      n: 2,
      owner: { kind: 'server', label: 'started from the panel' },
      ranks: [
        { rank: 0, state: 'idle' },
        { rank: 1, state: 'failed' }
      ],
      notebooks: [],
      ...over
    }) as unknown as IPool;
  it("says a server's pool gets a new engine for its lost rank only, as %dist restart", () => {
    expect(restartWhat(pool({}))).toBe(
      'This starts a new engine for rank 1 and re-forms the process group; ' +
        'the other ranks keep their variables, as `%dist restart` does.'
    );
    const healthy = pool({ ranks: [{ rank: 0, state: 'idle' }, { rank: 1, state: 'busy' }] as IPool['ranks'] });
    expect(restartWhat(healthy)).toContain('this re-forms the process group, and the ranks keep their variables');
  });
  it("says a notebook's pool is stopped and started again", () => {
    const theirs = pool({ owner: { kind: 'kernel', label: 'train.ipynb' } });
    expect(restartWhat(theirs)).toContain('ends its 2 engines (ranks 0-1) and starts 2 new ones');
    expect(restartWhat(theirs)).toContain('(it was started by train.ipynb).');
  });
});
