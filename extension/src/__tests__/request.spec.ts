import { ServerConnection } from '@jupyterlab/services';

import { WorkbenchAPI } from '../api';
import { requestAPI, WorkbenchAPIError } from '../request';

/** Real ServerConnection settings whose fetch answers what the test says. */
function settings(
  answer: (url: string, init: RequestInit) => Promise<Response>
): { settings: ServerConnection.ISettings; urls: string[] } {
  const urls: string[] = [];
  const fetch = (input: RequestInfo | URL, init?: RequestInit) => {
    const url = input instanceof Request ? input.url : String(input);
    const method = input instanceof Request ? input.method : init?.method;
    urls.push(url);
    return answer(url, { ...init, method });
  };
  return {
    settings: ServerConnection.makeSettings({
      baseUrl: 'http://localhost:8888/lab-base/',
      token: 'secret',
      fetch: fetch as typeof globalThis.fetch
    }),
    urls
  };
}

/** The error a request rejects with. */
async function failure(promise: Promise<unknown>): Promise<WorkbenchAPIError> {
  try {
    await promise;
  } catch (error) {
    expect(error).toBeInstanceOf(WorkbenchAPIError);
    return error as WorkbenchAPIError;
  }
  throw new Error('the request did not fail');
}

function json(body: unknown, status = 200): Promise<Response> {
  return Promise.resolve(
    new Response(JSON.stringify(body), {
      status,
      headers: { 'Content-Type': 'application/json' }
    })
  );
}

describe('requestAPI', () => {
  it('calls <base>/workbench/<endpoint> and parses the JSON', async () => {
    const s = settings(() => json({ pools: [] }));
    await expect(requestAPI('pools', {}, s.settings)).resolves.toEqual({
      pools: []
    });
    expect(s.urls[0]).toMatch(
      /^http:\/\/localhost:8888\/lab-base\/workbench\/pools/
    );
  });

  it('gives the server’s own message for an error answer', async () => {
    const s = settings(() =>
      json({ message: 'n must be a whole number of engines' }, 400)
    );
    const err = await failure(
      requestAPI('pools', { method: 'POST' }, s.settings)
    );
    expect(err.status).toBe(400);
    expect(err.message).toBe('n must be a whole number of engines');
  });

  it('says the server extension is missing on a non-JSON 404', async () => {
    const s = settings(() =>
      Promise.resolve(
        new Response('<html>404</html>', { status: 404, statusText: 'Not Found' })
      )
    );
    const err = await failure(requestAPI('pools', {}, s.settings));
    expect(err.status).toBe(404);
    expect(err.message).toMatch(/server extension is not enabled/);
  });

  it('names the status when an error has no message', async () => {
    const s = settings(() => json({}, 403));
    const err = await failure(requestAPI('pools', {}, s.settings));
    expect(err.status).toBe(403);
    expect(err.message).toMatch(/403/);
  });

  it('says the server cannot be reached when fetch fails', async () => {
    const s = settings(() => Promise.reject(new TypeError('Failed to fetch')));
    const err = await failure(requestAPI('pools', {}, s.settings));
    expect(err.status).toBeNull();
    expect(err.message).toMatch(/could not reach the Jupyter server/);
  });

  it('rejects a success answer that is not JSON', async () => {
    const s = settings(() => Promise.resolve(new Response('oops', { status: 200 })));
    await expect(requestAPI('pools', {}, s.settings)).rejects.toThrow(
      /not JSON/
    );
  });

  it('resolves an empty body to null', async () => {
    const s = settings(() => Promise.resolve(new Response('', { status: 200 })));
    await expect(requestAPI('pools', {}, s.settings)).resolves.toBeNull();
  });
});

describe('WorkbenchAPI', () => {
  it('uses the verbs that change state only for changes', async () => {
    const seen: string[] = [];
    const s = settings((url, init) => {
      seen.push(`${init.method ?? 'GET'} ${new URL(url).pathname}`);
      return json({ pools: [], pool: { id: 'x' } });
    });
    const api = new WorkbenchAPI(s.settings);
    await api.list();
    await api.start({ n: 2 });
    await api.stop('ab/c');
    await api.restart('x');
    expect(seen).toEqual([
      'GET /lab-base/workbench/pools',
      'POST /lab-base/workbench/pools',
      'DELETE /lab-base/workbench/pools/ab%2Fc',
      'POST /lab-base/workbench/pools/x/restart'
    ]);
  });
});
