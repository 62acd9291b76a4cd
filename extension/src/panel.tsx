import { ReactWidget, UseSignal } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import * as React from 'react';

import {
  attachedText,
  elapsedSeconds,
  formatBytes,
  formatPercent,
  IPool,
  IProblem,
  IRank,
  keptBadge,
  poolHealth,
  poolProblem,
  PoolsModel,
  poolStatusText,
  progressText,
  rankCounts,
  RANKS_SHOWN,
  meshText,
  ranksInOrder,
  rankSummary
} from './model';

/** What the buttons do (the plugin supplies dialogs and the notebook side). */
export interface IPanelActions {
  start(): void;
  startAdvanced(): void;
  stop(pool: IPool): void;
  restart(pool: IPool): void;
  retry(pool: IPool): void;
  dismiss(pool: IPool): void;
  useInNotebook(pool: IPool): void;
  canUseInNotebook(): boolean;
  openDashboard(pool: IPool): void;
  /** Every rank's stacks now, in a dialog (where the plugin offers it). */
  showStacks?(pool: IPool): void;
}

/** The "Distributed pools" sidebar. */
export class PoolsPanel extends ReactWidget {
  constructor(
    readonly model: PoolsModel,
    private readonly _actions: IPanelActions
  ) {
    super();
    this.id = 'workbench-pools';
    this.addClass('wb-PoolsPanel');
    this.title.caption = 'Distributed pools';
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.model.setVisible(!document.hidden);
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this.model.setVisible(false);
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    document.addEventListener('visibilitychange', this._onVisibility);
  }

  protected onBeforeDetach(msg: Message): void {
    document.removeEventListener('visibilitychange', this._onVisibility);
    super.onBeforeDetach(msg);
  }

  dispose(): void {
    document.removeEventListener('visibilitychange', this._onVisibility);
    this.model.dispose();
    super.dispose();
  }

  /** A browser tab in the background polls nothing. */
  private _onVisibility = (): void => {
    this.model.setVisible(this.isVisible && !document.hidden);
  };

  render(): JSX.Element {
    return (
      <UseSignal signal={this.model.changed}>
        {() => <PoolsView model={this.model} actions={this._actions} />}
      </UseSignal>
    );
  }
}

function PoolsView(props: {
  model: PoolsModel;
  actions: IPanelActions;
}): JSX.Element {
  const { model, actions } = props;
  const pools = model.pools;
  return (
    <div className="wb-Pools">
      <header className="wb-Pools-header">
        <h2>Distributed pools</h2>
      </header>
      {model.error !== null && (
        <div className="wb-Banner wb-mod-error" role="alert">
          <strong>Cannot list the pools.</strong> {model.error}
          <span className="wb-Banner-retry">
            {' '}
            Trying again in {Math.round(model.delay / 1000)} s.
          </span>
        </div>
      )}
      {model.loaded && pools.length === 0 ? (
        <div className="wb-Empty">
          <p>
            A pool is a set of engines, one per GPU (or CPU workers where there
            is none), joined into one torch.distributed process group that your
            notebook cells run on.
          </p>
          <StartButtons model={model} actions={actions} />
        </div>
      ) : (
        <>
          {model.loaded && <StartButtons model={model} actions={actions} />}
          {pools.map(pool => (
            <PoolCard
              key={pool.request_id ?? pool.id}
              pool={pool}
              busy={model.busy.has(pool.id)}
              expanded={model.isExpanded(pool.id)}
              onExpand={open => model.setExpanded(pool.id, open)}
              actions={actions}
            />
          ))}
        </>
      )}
      {model.actionError !== null && (
        <div className="wb-Banner wb-mod-error" role="alert">
          {model.actionError}
          <button
            className="wb-Banner-close"
            aria-label="Dismiss"
            title="Dismiss"
            onClick={() => model.dismissActionError()}
          >
            ×
          </button>
        </div>
      )}
      {!model.loaded && model.error === null && (
        <div className="wb-Loading">Looking for pools…</div>
      )}
    </div>
  );
}

function StartButtons(props: {
  model: PoolsModel;
  actions: IPanelActions;
}): JSX.Element {
  const info = props.model.info;
  const n = info?.default_n ?? 2;
  const what = info && info.gpus > 0 ? `${n} GPU engines` : `${n} CPU engines`;
  return (
    <div className="wb-StartRow">
      <button
        className="jp-mod-styled jp-mod-accept wb-StartButton"
        onClick={() => props.actions.start()}
        title={`Start a pool of ${what} on this machine`}
      >
        Start pool
      </button>
      <button
        className="jp-mod-styled wb-LinkButton"
        onClick={() => props.actions.startAdvanced()}
      >
        Advanced…
      </button>
      <span className="wb-StartRow-hint">{what}</span>
    </div>
  );
}

/** What a running pool runs on: ` · gloo, no GPU` (non-breaking: it wraps as one piece). */
function backendText(pool: IPool): string {
  return pool.backend
    ? ` · ${pool.backend}${pool.gpu_detected ? '' : ',\u00a0no\u00a0GPU'}`
    : '';
}

/** Where a pool runs and whose it is: `local on vm · started from the panel` (`local on vm · ` where the
 * kept mark says whose it is). */
function whereText(pool: IPool, hosts: string[], kept: boolean): string {
  const where =
    hosts.length === 1
      ? `${pool.launcher} on ${hosts[0]}`
      : hosts.length > 1
        ? `${pool.launcher} on ${hosts.length} hosts`
        : pool.launcher;
  return kept ? `${where} · ` : `${where} · ${pool.owner.label}`;
}

/** A pool: name, state and counts on a few lines; its ranks below (behind an expander past 4). */
function PoolCard(props: {
  pool: IPool;
  busy: boolean;
  expanded: boolean;
  onExpand: (open: boolean) => void;
  actions: IPanelActions;
}): JSX.Element {
  const { pool, busy, actions } = props;
  const [showLog, setShowLog] = React.useState(false);
  const showRanks = props.expanded;
  // what the card says about its ranks, worked out once per listing (one pass over them each)
  const counts = rankCounts(pool.ranks);
  const hosts = [...new Set(pool.ranks.map(r => r.host))];
  const health = poolHealth(pool, counts);
  const kept = keptBadge(pool);
  const where = whereText(pool, hosts, !!kept);
  const summary = rankSummary(pool.ranks, counts);
  const manyRanks = pool.ranks.length > RANKS_SHOWN;
  // a running card's state word leads its counts line: the header keeps its room for the whole name
  const countsLine = (
    <>
      <span
        className={`wb-Card-status wb-mod-${health}`}
        title={health === 'degraded' ? poolStatusText(pool) : undefined}
      >
        {health}
      </span>
      {` · ${summary}${backendText(pool)}`}
    </>
  );
  const canUse = actions.canUseInNotebook();
  return (
    <section
      className={`wb-Card wb-mod-${pool.state}`}
      data-pool-id={pool.id}
      data-state={pool.state}
      data-health={health}
    >
      <div className="wb-Card-head">
        <span
          className={`wb-Dot wb-mod-${health}`}
          aria-hidden="true"
          title={health === 'degraded' ? 'a rank failed' : pool.state}
        />
        <span className="wb-Card-title" title={`pool id ${pool.id}`}>
          {pool.name ?? `pool ${pool.id}`}
        </span>
        {pool.state !== 'running' && (
          <span className={`wb-Card-status wb-mod-${health}`}>{health}</span>
        )}
        {pool.state === 'running' && (
          <button
            className="wb-DashboardButton"
            aria-label="Open dashboard"
            title="Open dashboard: this pool's live loss, throughput and devices, beside the notebook"
            onClick={() => actions.openDashboard(pool)}
          >
            <svg viewBox="0 0 16 16" width="16" height="16" aria-hidden="true">
              <rect x="1" y="1.5" width="14" height="13" rx="2" />
              <polyline points="3.5,11 6.5,7.5 9,9.5 12.5,4.5" />
            </svg>
          </button>
        )}
        {pool.state === 'running' && actions.showStacks && (
          // an icon beside the dashboard's: a fourth text button wraps the compact card onto a second line
          <button
            className="wb-DashboardButton"
            aria-label="Stacks"
            title="Stacks: what every rank is doing now, its threads' stacks, the odd ranks first"
            onClick={() => actions.showStacks?.(pool)}
          >
            <svg viewBox="0 0 16 16" width="16" height="16" aria-hidden="true">
              <rect x="1.5" y="2" width="13" height="3" rx="1" />
              <rect x="1.5" y="6.5" width="13" height="3" rx="1" />
              <rect x="1.5" y="11" width="13" height="3" rx="1" />
            </svg>
          </button>
        )}
      </div>
      {pool.state === 'running' && !manyRanks && (
        <div className="wb-Card-meta wb-Card-counts">{countsLine}</div>
      )}
      {pool.state === 'running' && manyRanks && (
        // many ranks: the counts are the expander, the table of every rank behind it
        <button
          className="wb-Card-meta wb-Card-counts wb-Expander"
          aria-expanded={showRanks}
          title={showRanks ? 'Hide the ranks' : 'Show every rank, the failed ones first'}
          onClick={() => props.onExpand(!showRanks)}
        >
          <span className="wb-Expander-caret" aria-hidden="true">
            {showRanks ? '▾' : '▸'}
          </span>
          <span>{countsLine}</span>
        </button>
      )}
      {pool.state === 'running' && (pool.meshes ?? []).length > 0 && (
        // a split pool: each sub-mesh is its own group, busy or idle on its own
        <div className="wb-Card-meta wb-Card-meshes" title="sub-meshes (%dist split; %dist join re-forms the pool)">
          {'sub-meshes: '}
          {(pool.meshes ?? []).map((m, i) => (
            // the separator outside the sub-mesh's own words: the line breaks there, never inside them
            <React.Fragment key={m.name}>
              {i > 0 ? ' · ' : ''}
              <span className={`wb-Mesh wb-mod-${m.state}`} data-mesh={m.name}>
                {meshText(m)}
              </span>
            </React.Fragment>
          ))}
        </div>
      )}
      <div className="wb-Card-meta" title={kept ? kept.title : where}>
        {where}
        {kept && (
          // on the line that says whose it is: the title keeps the card's width for the name
          <span className="wb-Card-kept">{kept.text}</span>
        )}
      </div>
      {pool.slurm && (
        <div className="wb-Card-meta wb-Card-slurm" title={pool.slurm}>
          {pool.slurm}
        </div>
      )}
      {attachedText(pool) && (
        <div className="wb-Card-meta wb-Card-notebooks" title={attachedText(pool)}>
          {attachedText(pool)}
        </div>
      )}

      {pool.state === 'starting' && (
        <div className="wb-Progress">
          <div
            className="wb-Progress-bar"
            role="progressbar"
            aria-valuemin={0}
            aria-valuemax={pool.n}
            aria-valuenow={pool.engines_up}
          >
            <div
              className="wb-Progress-fill"
              style={{
                width: `${pool.n ? (100 * pool.engines_up) / pool.n : 0}%`
              }}
            />
          </div>
          <div className="wb-Progress-text">
            {progressText(pool)} · {elapsedSeconds(pool.created)} s
          </div>
        </div>
      )}

      {pool.state === 'failed' && (
        <div className="wb-Error" role="alert">
          <ProblemText problem={poolProblem(pool)} />
          <div className="wb-Card-actions">
            <button
              className="jp-mod-styled jp-mod-accept"
              disabled={busy}
              title="Open the start dialog with the values this pool had"
              onClick={() => actions.retry(pool)}
            >
              Retry
            </button>
            <button
              className="jp-mod-styled"
              onClick={() => setShowLog(!showLog)}
            >
              {showLog ? 'Hide log' : 'Show log'}
            </button>
            <button
              className="jp-mod-styled"
              disabled={busy}
              onClick={() => actions.dismiss(pool)}
            >
              Dismiss
            </button>
          </div>
          {showLog && <pre className="wb-Log">{pool.log.join('\n')}</pre>}
        </div>
      )}

      {pool.ranks.length > 0 &&
        pool.state !== 'failed' &&
        (!manyRanks || showRanks) && <RankTable pool={pool} manyHosts={hosts.length > 1} />}

      {(pool.state === 'starting' ||
        (pool.state === 'stopping' && pool.ranks.length === 0)) && (
        <div className="wb-Card-actions">
          <button
            className="jp-mod-styled"
            disabled={busy || pool.state === 'stopping'}
            onClick={() => actions.stop(pool)}
          >
            {pool.state === 'stopping' ? 'Cancelling…' : 'Cancel'}
          </button>
        </div>
      )}

      {(pool.state === 'running' ||
        (pool.state === 'stopping' && pool.ranks.length > 0)) && (
        <div className="wb-Card-actions">
          <button
            className="jp-mod-styled jp-mod-accept"
            disabled={busy || pool.state !== 'running' || !canUse}
            title={
              canUse
                ? 'Insert a cell that attaches the current notebook to this pool'
                : 'Open a notebook first'
            }
            onClick={() => actions.useInNotebook(pool)}
          >
            Use in notebook
          </button>
          <button
            className="jp-mod-styled"
            disabled={busy || pool.state !== 'running'}
            onClick={() => actions.restart(pool)}
          >
            Restart
          </button>
          <button
            className="jp-mod-styled jp-mod-warn"
            disabled={busy || pool.state === 'stopping'}
            onClick={() => actions.stop(pool)}
          >
            {pool.state === 'stopping' ? 'Stopping…' : 'Stop'}
          </button>
        </div>
      )}
    </section>
  );
}

/**
 * A failure as the server sent it: what went wrong, the launcher's last lines, the log's path, what to
 * do; one line each, as the workbench prints it.
 */
function ProblemText(props: { problem: IProblem }): JSX.Element {
  const { what, tail, log, todo } = props.problem;
  return (
    <pre className="wb-Error-text">
      <span className="wb-Error-what">{what}</span>
      {tail.length > 0 && (
        <span className="wb-Error-tail">{tail.map(line => `\n  | ${line}`).join('')}</span>
      )}
      {log && <span className="wb-Error-log">{`\nLog: ${log}`}</span>}
      {todo && <span className="wb-Error-todo">{`\n${todo}`}</span>}
    </pre>
  );
}

/** The ranks: GPU figures where there are GPUs, else the engine's CPU and memory. */
function RankTable(props: { pool: IPool; manyHosts: boolean }): JSX.Element {
  const { pool, manyHosts } = props;
  const gpu = pool.gpu_detected;
  const split = (pool.meshes ?? []).length > 0;
  // (one host: it is named above the table, and the columns keep their room)
  return (
    <table className="wb-Ranks">
      <thead>
        <tr>
          <th>rank</th>
          {manyHosts && <th>host</th>}
          {split && <th title="the sub-mesh the rank is in (%dist split)">mesh</th>}
          <th>device</th>
          <th>state</th>
          {gpu ? (
            <th title="GPU utilisation">GPU</th>
          ) : (
            <th title="CPU use of the engine process">CPU</th>
          )}
          {gpu ? (
            <th title="GPU memory in use">mem</th>
          ) : (
            <th title="resident memory of the engine process">mem</th>
          )}
        </tr>
      </thead>
      <tbody>
        {ranksInOrder(pool.ranks).map((r: IRank) => (
          <tr
            key={r.rank}
            className={`wb-Rank wb-mod-${r.state}`}
            title={
              `rank ${r.rank}: pid ${r.pid} on ${r.host}, ` +
              `CPU ${formatPercent(r.cpu_percent)}, memory ${formatBytes(r.memory_bytes)}`
            }
          >
            <td>{r.rank}</td>
            {manyHosts && <td className="wb-Rank-host">{r.host}</td>}
            {split && <td className="wb-Rank-mesh">{r.mesh ?? ''}</td>}
            <td>{r.device}</td>
            <td>
              <span className={`wb-State wb-mod-${r.state}`}>{r.state}</span>
            </td>
            <td>{formatPercent(gpu ? r.gpu_util : r.cpu_percent)}</td>
            <td>
              {formatBytes(gpu ? r.gpu_memory_bytes : r.memory_bytes)}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}
