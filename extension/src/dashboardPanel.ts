import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { WorkbenchAPI } from './api';
import { DashboardFeed } from './dashboard';
// the notebook dashboard's module, as the server serves it (compiled from ./widget/dashboard.ts)
import type { IDashboardModule } from './widget/dashboard';

/** How often a visible dashboard asks the server (the kernel's dashboard refreshes about as often). */
export const DASHBOARD_POLL_MS = 1000;
/**
 * How often a hidden one asks: seldom, but within the server's 30 s, so its dashboard keeps refreshing
 * while the panel is open behind another tab (one that sleeps is drawn again whole when asked).
 */
export const DASHBOARD_HIDDEN_POLL_MS = 10000;

type Cleanup = (() => void) | void;

let dashboardModule: Promise<IDashboardModule> | null = null;

/** The notebook dashboard's own module, from the server's package, loaded once per page. */
function loadModule(api: WorkbenchAPI): Promise<IDashboardModule> {
  if (!dashboardModule) {
    dashboardModule = (async () => {
      const code = await api.dashboardCode('dashboard.js');
      const url = URL.createObjectURL(
        new Blob([code], { type: 'text/javascript' })
      );
      try {
        const module = await import(/* webpackIgnore: true */ url);
        return module.default as IDashboardModule;
      } finally {
        URL.revokeObjectURL(url);
      }
    })().catch(error => {
      dashboardModule = null; // the next panel tries again
      throw error;
    });
  }
  return dashboardModule;
}

/**
 * One pool's live dashboard in the main area: polls about once a second while visible, draws with
 * the notebook dashboard's module; when the pool stops it says so and keeps the last picture.
 */
export class DashboardPanel extends Widget {
  constructor(
    readonly pool: string,
    readonly label: string,
    private readonly _api: WorkbenchAPI
  ) {
    super();
    this.addClass('wb-DashboardPanel');
    this._status = document.createElement('div');
    this._status.className = 'wb-DashboardPanel-status';
    this._status.setAttribute('role', 'status');
    this._body = document.createElement('div');
    this._body.className = 'wb-DashboardPanel-body';
    this.node.append(this._status, this._body);
    this.feed = new DashboardFeed(
      pool,
      _api,
      () => _api.dashboardCode('plotly.min.js'),
      label
    );
  }

  readonly feed: DashboardFeed;

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._poll();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    document.addEventListener('visibilitychange', this._onVisibility);
    if (this.isVisible) {
      this._poll(); // attached in view: no after-show comes
    }
  }

  protected onBeforeDetach(msg: Message): void {
    document.removeEventListener('visibilitychange', this._onVisibility);
    super.onBeforeDetach(msg);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    document.removeEventListener('visibilitychange', this._onVisibility);
    this._stopTimer();
    this._undraw();
    super.dispose();
  }

  private _onVisibility = (): void => {
    if (!document.hidden) {
      this._poll();
    }
  };

  /** Ask now, draw what changed, and ask again in a second while visible (every 10 s while hidden). */
  private _poll(): void {
    this._stopTimer();
    if (this._polling || this.isDisposed) {
      return;
    }
    this._polling = true;
    void (async () => {
      try {
        if (await this.feed.poll()) {
          await this._draw();
        }
      } catch (error) {
        this.feed.status = { kind: 'error', message: String(error) };
      } finally {
        this._polling = false;
      }
      this._showStatus();
      if (this.feed.status.kind !== 'stopped' && !this.isDisposed) {
        const visible = this.isVisible && !document.hidden;
        this._timer = setTimeout(
          () => this._poll(),
          visible ? DASHBOARD_POLL_MS : DASHBOARD_HIDDEN_POLL_MS
        );
      }
    })();
  }

  /** A new view (the first answer, or a new run): drawn from scratch by the notebook's module. */
  private async _draw(): Promise<void> {
    const model = this.feed.model!;
    const module = await loadModule(this._api);
    this._undraw();
    const el = document.createElement('div');
    this._body.append(el);
    const ends: Cleanup[] = [];
    this._cleanups = ends;
    ends.push(await module.initialize?.({ model }));
    ends.push(await module.render({ model, el }));
  }

  private _undraw(): void {
    for (const end of this._cleanups) {
      end?.();
    }
    this._cleanups = [];
    this._body.replaceChildren();
  }

  private _showStatus(): void {
    const status = this.feed.status;
    this._status.textContent = status.kind === 'live' ? '' : status.message;
    this._status.dataset.kind = status.kind;
    this.node.dataset.state = status.kind;
  }

  private _stopTimer(): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
  }

  private _status: HTMLElement;
  private _body: HTMLElement;
  private _cleanups: Cleanup[] = [];
  private _timer: ReturnType<typeof setTimeout> | null = null;
  private _polling = false;
}
