/**
 * The docked dashboard's logic, without the page: what the server answers, and the small model that
 * the notebook's own dashboard module (./widget/dashboard.ts, compiled to workbench/widgets/dashboard.js)
 * draws from.
 *
 * The module is an anywidget: it reads traits with `model.get`, listens to `change:<trait>` and to
 * `msg:custom` point messages, and asks the widget manager for plotly.js. `DashboardModel` is that
 * much of a widget model, fed by polling instead of by a kernel, so the docked panel draws with the
 * same code as the notebook.
 */

/** One answer of `GET /workbench/pools/<id>/dashboard?since=N&view=ID`. */
export interface IDashboardAnswer {
  pool: string;
  /** A new value: a new run, the page starts over. */
  view: string;
  seq: number;
  /** False once the run ended (the last picture stays). */
  live: boolean;
  /** The pool stopped: this is its last picture (kept by the server, also after a page reload). */
  stopped?: boolean;
  summary: string;
  header: string;
  note: string;
  devices: string;
  bars: string;
  /** Present when the page must draw the whole figure (first answer, rebuilt, or behind). */
  figure?: { data?: unknown[]; layout?: unknown };
  /** New points since `since`, in order. */
  extend: { indices: number[]; x: unknown[][]; y: unknown[][] }[];
}

import type { IWidgetModel } from './widget/dashboard';

export const TEXTS = ['header', 'note', 'devices', 'bars'] as const;

type Listener = (value?: unknown) => void;

/** As much of an anywidget model as dashboard.js uses. */
export class DashboardModel implements IWidgetModel {
  /**
   * @param uid the view's id (dashboard.js keeps its points per uid)
   * @param plotly loads plotly.js's code (asked once per page, by the first view drawn)
   */
  constructor(
    uid: string,
    plotly: () => Promise<ArrayBuffer>
  ) {
    this._state = {
      uid,
      library: 'plotly',
      header: '',
      note: '',
      devices: '',
      bars: '',
      figure: {}
    };
    this.widget_manager = {
      get_model: async () => {
        const code = await plotly();
        return { get: () => code };
      }
    };
  }

  readonly widget_manager: {
    get_model(id: string): Promise<{ get(name: string): unknown }>;
  };

  get(name: string): unknown {
    return this._state[name];
  }

  on(event: string, listener: Listener): void {
    const list = this._listeners.get(event) ?? [];
    list.push(listener);
    this._listeners.set(event, list);
  }

  off(event?: string, listener?: Listener): void {
    if (event === undefined) {
      this._listeners.clear();
    } else if (listener === undefined) {
      this._listeners.delete(event);
    } else {
      const list = this._listeners.get(event) ?? [];
      this._listeners.set(
        event,
        list.filter(l => l !== listener)
      );
    }
  }

  /** Set a trait; its listeners hear of it when it changed. */
  set(name: string, value: unknown): void {
    if (this._state[name] === value) {
      return;
    }
    this._state[name] = value;
    this._emit(`change:${name}`);
  }

  /** A custom message, as a kernel's `view.send(...)` arrives. */
  receive(msg: unknown): void {
    this._emit('msg:custom', msg);
  }

  /** Take one answer of the server (of this model's view). */
  apply(answer: IDashboardAnswer): void {
    for (const name of TEXTS) {
      this.set(name, answer[name]);
    }
    if (answer.figure !== undefined) {
      this._state.figure = answer.figure; // always drawn again: the points behind it changed
      this._emit('change:figure');
    }
    for (const extend of answer.extend) {
      this.receive({ extend });
    }
  }

  private _emit(event: string, value?: unknown): void {
    for (const listener of [...(this._listeners.get(event) ?? [])]) {
      listener(value);
    }
  }

  private _state: Record<string, unknown>;
  private _listeners = new Map<string, Listener[]>();
}

/** What the docked panel shows above the dashboard: nothing, a pool that stopped, or an error. */
export type FeedStatus =
  | { kind: 'live' }
  | { kind: 'stopped'; message: string }
  | { kind: 'error'; message: string };

/** The server's side: one question per poll. */
export interface IDashboardSource {
  dashboard(pool: string, since: number, view: string): Promise<IDashboardAnswer>;
}

/**
 * Polls one pool's dashboard and keeps what was seen (`view`, `seq`); the panel draws each new view.
 *
 * An answer marked `stopped` is the pool's last picture, kept by the server: drawn (also after a page
 * reload), then polling ends with a sentence that says so. A 404 means the pool stopped before any page
 * asked for its dashboard: the same sentence, over whatever was drawn.
 */
export class DashboardFeed {
  constructor(
    readonly pool: string,
    private readonly _source: IDashboardSource,
    private readonly _plotly: () => Promise<ArrayBuffer>,
    readonly label: string = pool // the pool's name, as its card says
  ) {}

  /** The model of the view shown now (`null` before the first answer). */
  model: DashboardModel | null = null;
  status: FeedStatus = { kind: 'live' };
  summary = '';

  /** Ask once; returns whether the view changed (the panel then draws the new model from scratch). */
  async poll(): Promise<boolean> {
    if (this.status.kind === 'stopped') {
      return false;
    }
    let answer: IDashboardAnswer;
    try {
      answer = await this._source.dashboard(this.pool, this._seq, this._view);
    } catch (error) {
      const status = (error as { status?: number | null }).status;
      const message = String((error as Error)?.message ?? error);
      this.status =
        status === 404 ? this._stopped() : { kind: 'error', message };
      return false;
    }
    this.status = answer.stopped ? this._stopped() : { kind: 'live' };
    this.summary = answer.summary;
    const fresh = answer.view !== this._view || this.model === null;
    if (fresh) {
      this.model = new DashboardModel(answer.view, this._plotly);
    }
    this._view = answer.view;
    this._seq = answer.seq;
    this.model!.apply(answer);
    return fresh;
  }

  private _stopped(): FeedStatus {
    return {
      kind: 'stopped',
      message: `Pool ${this.label} stopped: this is its last picture.`
    };
  }

  private _seq = 0;
  private _view = '';
}
