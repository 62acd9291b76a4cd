import {
  DashboardFeed,
  DashboardModel,
  IDashboardAnswer,
  IDashboardSource
} from '../dashboard';

function answer(overrides: Partial<IDashboardAnswer> = {}): IDashboardAnswer {
  return {
    pool: 'abc123',
    view: 'v1',
    seq: 1,
    live: true,
    summary: 'run 1 training · step 3',
    header: '<b>run 1 training · step 3</b>',
    note: '',
    devices: '<table></table>',
    bars: '',
    extend: [],
    ...overrides
  };
}

const FIGURE = { data: [{ x: [1, 2, 3], y: [0.9, 0.8, 0.7] }], layout: {} };

/** A server that answers from a list, and records what it was asked. */
class Source implements IDashboardSource {
  constructor(private readonly _answers: (IDashboardAnswer | Error)[]) {}
  asked: [string, number, string][] = [];
  async dashboard(pool: string, since: number, view: string) {
    this.asked.push([pool, since, view]);
    const next = this._answers.shift()!;
    if (next instanceof Error) {
      throw next;
    }
    return next;
  }
}

class HTTPError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
  }
}

const noPlotly = async () => new ArrayBuffer(0);

describe('DashboardModel', () => {
  it('is the part of a widget model that dashboard.js uses', async () => {
    const model = new DashboardModel('v1', async () => new TextEncoder().encode('code').buffer);
    const seen: string[] = [];
    model.on('change:header', () => seen.push(`header ${model.get('header')}`));
    model.on('change:figure', () => seen.push('figure'));
    model.on('msg:custom', msg => seen.push(`msg ${JSON.stringify(msg)}`));
    model.apply(answer({ figure: FIGURE }));
    model.apply(answer({ seq: 2, extend: [{ indices: [0], x: [[4]], y: [[0.6]] }] }));
    expect(seen).toEqual([
      'header <b>run 1 training · step 3</b>',
      'figure',
      'msg {"extend":{"indices":[0],"x":[[4]],"y":[[0.6]]}}'
    ]); // the same header again: no change event
    expect(model.get('uid')).toBe('v1');
    const library = await model.widget_manager.get_model(model.get('library') as string);
    expect(new TextDecoder().decode(library.get('code') as ArrayBuffer)).toBe('code');
    model.off('msg:custom');
    model.receive({ extend: {} });
    expect(seen).toHaveLength(3);
  });
});

describe('DashboardFeed', () => {
  it('asks for what came since its last answer, and starts over on a new view', async () => {
    const source = new Source([
      answer({ figure: FIGURE }),
      answer({ seq: 2, extend: [{ indices: [0], x: [[4]], y: [[0.6]] }] }),
      answer({ view: 'v2', seq: 1, figure: { data: [] }, header: 'run 2' })
    ]);
    const feed = new DashboardFeed('abc123', source, noPlotly);
    expect(await feed.poll()).toBe(true); // the first view: drawn
    const first = feed.model;
    expect(await feed.poll()).toBe(false); // points only: the same model hears them
    expect(feed.model).toBe(first);
    expect(await feed.poll()).toBe(true); // a new run: a new model, drawn from scratch
    expect(feed.model).not.toBe(first);
    expect(feed.model!.get('header')).toBe('run 2');
    expect(source.asked).toEqual([
      ['abc123', 0, ''],
      ['abc123', 1, 'v1'],
      ['abc123', 2, 'v1']
    ]);
    expect(feed.summary).toBe('run 1 training · step 3');
  });

  it('says the pool stopped on a 404, keeps the picture and asks no more', async () => {
    const source = new Source([
      answer({ figure: FIGURE }),
      new HTTPError("no pool 'abc123' on this server", 404)
    ]);
    const feed = new DashboardFeed('abc123', source, noPlotly);
    await feed.poll();
    const model = feed.model;
    await feed.poll();
    expect(feed.status).toEqual({
      kind: 'stopped',
      message: 'Pool abc123 stopped: this is its last picture.'
    });
    expect(feed.model).toBe(model);
    expect(await feed.poll()).toBe(false);
    expect(source.asked).toHaveLength(2);
  });

  it('draws a stopped pool\'s last picture (a page reloaded after the stop) and asks no more', async () => {
    const source = new Source([
      answer({ live: false, stopped: true, figure: FIGURE, header: 'run 1 finished at step 60' })
    ]);
    const feed = new DashboardFeed('abc123', source, noPlotly, 'pool-fair-otter');
    expect(await feed.poll()).toBe(true); // drawn, as the run ended
    expect(feed.model!.get('header')).toBe('run 1 finished at step 60');
    expect(feed.status).toEqual({
      kind: 'stopped',
      message: 'Pool pool-fair-otter stopped: this is its last picture.'
    });
    expect(await feed.poll()).toBe(false);
    expect(source.asked).toHaveLength(1);
  });

  it('shows another error and goes on asking', async () => {
    const source = new Source([
      new HTTPError('could not reach the Jupyter server', 0),
      answer({ figure: FIGURE })
    ]);
    const feed = new DashboardFeed('abc123', source, noPlotly);
    await feed.poll();
    expect(feed.status).toEqual({
      kind: 'error',
      message: 'could not reach the Jupyter server'
    });
    expect(await feed.poll()).toBe(true);
    expect(feed.status).toEqual({ kind: 'live' });
  });
});
