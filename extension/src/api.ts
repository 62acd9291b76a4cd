import { ServerConnection } from '@jupyterlab/services';

import {
  IInfo,
  IInterface,
  IPool,
  IStartOptions,
  IWorkbenchAPI
} from './model';
import { requestAPI } from './request';

/** The workbench REST API of the Jupyter server this Lab runs on. */
export class WorkbenchAPI implements IWorkbenchAPI {
  constructor(private readonly _settings?: ServerConnection.ISettings) {}

  info(): Promise<IInfo> {
    return requestAPI<IInfo>('info', {}, this._settings);
  }

  async interfaces(): Promise<IInterface[]> {
    const path = 'interfaces';
    return (
      await requestAPI<{ interfaces: IInterface[] }>(path, {}, this._settings)
    ).interfaces;
  }

  async list(): Promise<IPool[]> {
    return (await requestAPI<{ pools: IPool[] }>('pools', {}, this._settings))
      .pools;
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

  async restart(id: string): Promise<IPool> {
    const path = `pools/${encodeURIComponent(id)}/restart`;
    const init = { method: 'POST', body: '{}' };
    return (await requestAPI<{ pool: IPool }>(path, init, this._settings)).pool;
  }
}
