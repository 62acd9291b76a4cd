import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { IProblem } from './model';

/**
 * An error from the workbench server extension, with the sentence the server
 * gave (or one that says what went wrong on the way there), and the server's
 * `problem`: the same in the panel's words, as parts (`null` when it sent none).
 */
export class WorkbenchAPIError extends Error {
  constructor(
    message: string,
    readonly status: number | null,
    readonly problem: IProblem | null = null
  ) {
    super(message);
    this.name = 'WorkbenchAPIError';
  }
}

/**
 * Call the workbench REST API under `<base url>/workbench/`.
 *
 * Resolves with the parsed JSON body (or `null` for an empty one); rejects with
 * a `WorkbenchAPIError` whose message is the server's own `message` field when
 * there is one, and whose `problem` is the server's sentence for the panel, shown
 * to the person as it is.
 */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'workbench', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new WorkbenchAPIError(
      `could not reach the Jupyter server (${String(
        (error as Error)?.message ?? error
      )}); is it still running?`,
      null
    );
  }
  const text = await response.text();
  let data: unknown = null;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      if (!response.ok) {
        throw new WorkbenchAPIError(
          `the server answered ${response.status} ${response.statusText}` +
            (response.status === 404
              ? ': the workbench server extension is not enabled (pip install distributed-workbench, then restart Jupyter)'
              : ''),
          response.status
        );
      }
      throw new WorkbenchAPIError(
        `the server sent something that is not JSON (${text.slice(0, 80)})`,
        response.status
      );
    }
  }
  if (!response.ok) {
    const said = (data ?? {}) as { message?: unknown; problem?: IProblem };
    const message =
      typeof said.message === 'string' && said.message
        ? said.message
        : `the server answered ${response.status} ${response.statusText}`;
    const problem =
      said.problem && typeof said.problem === 'object' && typeof said.problem.what === 'string'
        ? said.problem
        : null;
    throw new WorkbenchAPIError(message, response.status, problem);
  }
  return data as T;
}
