import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { IDashboardAnswer, IDashboardSource } from './dashboard';
import {
  IInfo,
  IPool,
  IStacks,
  IStartForm,
  IStartOptions,
  IWorkbenchAPI
} from './model';
import { requestAPI, WorkbenchAPIError } from './request';

/** The workbench REST API of the Jupyter server this Lab runs on. */
export class WorkbenchAPI implements IWorkbenchAPI, IDashboardSource {
  constructor(private readonly _settings?: ServerConnection.ISettings) {}

  info(): Promise<IInfo> {
    return requestAPI<IInfo>('info', {}, this._settings);
  }

  /** The start dialog's fields, made by the server from `PoolConfig`'s (this machine's interfaces too). */
  startForm(): Promise<IStartForm> {
    return requestAPI<IStartForm>('options', {}, this._settings);
  }

  async list(countOnly: string[] = []): Promise<IPool[]> {
    const query = countOnly.length
      ? URLExt.objectToQueryString({ count_only: countOnly.join(',') })
      : '';
    return (
      await requestAPI<{ pools: IPool[] }>(`pools${query}`, {}, this._settings)
    ).pools;
  }

  async start(options: IStartOptions): Promise<IPool> {
    const init = { method: 'POST', body: JSON.stringify(options) };
    return (await requestAPI<{ pool: IPool }>('pools', init, this._settings))
      .pool;
  }

  async stop(id: string): Promise<void> {
    const path = `pools/${encodeURIComponent(id)}`;
    await requestAPI(path, { method: 'DELETE' }, this._settings);
  }

  /** A pool's live dashboard: what came since `since` of view `view` (nothing seen: 0 and ''). */
  dashboard(id: string, since: number, view: string): Promise<IDashboardAnswer> {
    const query = URLExt.objectToQueryString({ since, view });
    const path = `pools/${encodeURIComponent(id)}/dashboard${query}`;
    return requestAPI<IDashboardAnswer>(path, {}, this._settings);
  }

  /** The dashboard's page code from the server's packages: `dashboard.js` or `plotly.min.js`. */
  async dashboardCode(name: 'dashboard.js' | 'plotly.min.js'): Promise<ArrayBuffer> {
    const settings = this._settings ?? ServerConnection.makeSettings();
    const url = URLExt.join(settings.baseUrl, 'workbench', 'dashboard', name);
    const response = await ServerConnection.makeRequest(url, {}, settings);
    if (!response.ok) {
      throw new WorkbenchAPIError(
        `could not load ${name} for the dashboard: the server answered ${response.status}`,
        response.status
      );
    }
    return response.arrayBuffer();
  }

  /** Every rank's stacks now, grouped, the odd ranks first (what `%dist stacks` prints). */
  stacks(id: string): Promise<IStacks> {
    const path = `pools/${encodeURIComponent(id)}/stacks`;
    return requestAPI<IStacks>(path, {}, this._settings);
  }

  async restart(id: string): Promise<IPool> {
    const path = `pools/${encodeURIComponent(id)}/restart`;
    const init = { method: 'POST', body: '{}' };
    return (await requestAPI<{ pool: IPool }>(path, init, this._settings)).pool;
  }
}
