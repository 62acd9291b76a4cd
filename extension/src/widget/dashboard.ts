/**
 * The live training dashboard in the page: an anywidget module (kernel side: workbench/widgets/view.py,
 * live_dashboard.py), compiled by the package's build into workbench/widgets/dashboard.js, the ES module
 * the notebook's widget loads and the Jupyter server serves to the docked dashboard. It imports nothing:
 * the page loads it alone, from the kernel or from the server (never a CDN).
 *
 * The kernel sends the whole figure only when it is built or its older points were thinned (trait
 * `figure`); new points come as small "extend" messages, appended with Plotly.extendTraces, about once a
 * second. plotly.js comes from the kernel's plotly package, once per page.
 */

/** One line of the figure, as plotly takes it (only its points are touched here). */
export interface ITrace {
  x: unknown[];
  y: unknown[];
  [key: string]: unknown;
}

/** An axis of the layout (only its place on the page is touched here). */
export interface IAxis {
  domain?: number[];
  [key: string]: unknown;
}

/** The kernel's layout of the figure: the loss plot (`xaxis`), and the throughput plot beside it. */
export interface ILayout {
  width?: number;
  height?: number;
  xaxis?: IAxis;
  yaxis?: IAxis;
  xaxis2?: IAxis;
  yaxis2?: IAxis;
  legend?: Record<string, unknown>;
  [key: string]: unknown;
}

/** The trait `figure`: the whole figure, or `{}` while there is no point. */
export interface IFigure {
  data?: ITrace[];
  layout?: ILayout;
}

/** New points: for each trace `indices[k]`, the points `x[k]`, `y[k]` to append. */
export interface IExtend {
  indices: number[];
  x: unknown[][];
  y: unknown[][];
}

/** A custom message of the kernel's widget. */
export interface IMessage {
  extend?: IExtend;
}

/** As much of an anywidget model as this module uses (the docked panel's `DashboardModel` is one). */
export interface IWidgetModel {
  get(name: string): unknown;
  on(event: string, listener: (value?: any) => void): void;
  /** A custom message to the kernel (a real widget's model has it; the docked panel's does not). */
  send?(content: object): void;
  readonly widget_manager: {
    get_model(id: string): Promise<{ get(name: string): unknown }>;
  };
}

/** As much of plotly.js as this module uses. */
interface IPlotly {
  react(el: HTMLElement, data: ITrace[], layout: ILayout | undefined, config: object): Promise<unknown>;
  extendTraces(el: HTMLElement, update: { x: unknown[][]; y: unknown[][] }, indices: number[]): unknown;
  purge(el: HTMLElement): void;
}

type Cleanup = () => void;

/** The module as anywidget (and the docked panel) calls it. */
export interface IDashboardModule {
  initialize(props: { model: IWidgetModel }): Cleanup;
  render(props: { model: IWidgetModel; el: HTMLElement }): Promise<Cleanup>;
}

const stores = new Map<string, { data: ITrace[] }>(); // uid -> every point so far, for views made later
// staticPlot: no hover or zoom layers to rebuild at every redraw (the figure left when the run ends has them)
const CONFIG = { staticPlot: true };
/**
 * Below this width (a notebook beside a docked dashboard, a narrow panel) the throughput plot goes under
 * the loss plot instead of beside it.
 */
export const NARROW_PX = 560;
export const STACKED_EXTRA_PX = 200;
/** A change of width the figure is laid out again for (smaller ones are a scroll bar coming and going). */
export const RELAYOUT_PX = 4;

/** The traces with their points copied (plotly keeps and extends the arrays it is given). */
export function copy(data: ITrace[]): ITrace[] {
  return data.map(t => ({ ...t, x: [...t.x], y: [...t.y] }));
}

/** The kernel's layout, for the width there is: as it is, or stacked when narrow. */
export function fit(layout: ILayout | undefined, width: number): ILayout | undefined {
  if (!width || !layout) {
    return layout; // not laid out yet (a hidden panel): plotly's own size
  }
  if (!layout.xaxis2 || width >= NARROW_PX) {
    return { ...layout, width };
  }
  return {
    ...layout,
    width,
    height: layout.height === undefined ? undefined : layout.height + STACKED_EXTRA_PX,
    xaxis: { ...layout.xaxis, domain: [0, 1] },
    yaxis: { ...layout.yaxis, domain: [0.56, 1] },
    xaxis2: { ...layout.xaxis2, domain: [0, 1] },
    yaxis2: { ...layout.yaxis2, domain: [0, 0.36] },
    legend: { ...layout.legend, y: -0.2 }
  };
}

/** Append an extend message's points to the traces they belong to. */
export function append(data: ITrace[], extend: IExtend): void {
  extend.indices.forEach((i, k) => {
    data[i].x.push(...extend.x[k]);
    data[i].y.push(...extend.y[k]);
  });
}

/** Whether a view drawn `drawn` pixels wide is laid out again at `width` (0: not laid out, hidden). */
export function relayout(drawn: number, width: number): boolean {
  return width > 0 && Math.abs(width - drawn) > RELAYOUT_PX;
}

const shared = globalThis as typeof globalThis & {
  __workbenchPlotly?: Promise<IPlotly> | null;
  Plotly?: Partial<IPlotly>; // a page's own plotly.js, if it has one (and a whole one)
};

/** plotly.js, from the page if it has it, else from the kernel's library model (once per page). */
function plotly(model: IWidgetModel): Promise<IPlotly> {
  if (!shared.__workbenchPlotly) {
    shared.__workbenchPlotly = (async () => {
      if (shared.Plotly && shared.Plotly.extendTraces) {
        return shared.Plotly as IPlotly;
      }
      const library = await model.widget_manager.get_model(model.get('library') as string);
      const module = { exports: {} as IPlotly };
      const code = new TextDecoder().decode(library.get('code') as ArrayBuffer);
      new Function('module', 'exports', code)(module, module.exports);
      return module.exports;
    })().catch(err => {
      shared.__workbenchPlotly = null; // the next view tries again
      throw err;
    });
  }
  return shared.__workbenchPlotly;
}

function figureOf(model: IWidgetModel): IFigure {
  return (model.get('figure') ?? {}) as IFigure;
}

function initialize({ model }: { model: IWidgetModel }): Cleanup {
  // the kernel hears that this page has the widget manager and this module: the widget can render here
  // (a front end without them never creates the model, and the kernel falls back to plain HTML updates)
  if (typeof model.send === 'function') {
    model.send({ alive: true });
  }
  const uid = model.get('uid') as string;
  const store = { data: copy(figureOf(model).data || []) };
  stores.set(uid, store);
  const onFigure = () => (store.data = copy(figureOf(model).data || []));
  const onMessage = (msg: IMessage) => msg.extend && append(store.data, msg.extend);
  model.on('change:figure', onFigure);
  model.on('msg:custom', onMessage);
  return () => stores.delete(uid);
}

async function render({ model, el }: { model: IWidgetModel; el: HTMLElement }): Promise<Cleanup> {
  el.classList.add('workbench-dashboard');
  el.style.width = '100%';
  el.style.contain = 'content'; // its redraws never make the browser lay out the rest of the notebook
  el.innerHTML =
    "<div class='workbench-dashboard-header'></div>" +
    "<div class='workbench-dashboard-note' style='padding:1em 0;color:#555'></div>" +
    "<div class='workbench-loss-plot'></div><div class='workbench-device-panel'></div>" +
    "<div class='workbench-bars'></div>";
  const [header, note, plot, devices, bars] = Array.from(el.children) as HTMLElement[];
  const parts = { header, devices, bars }; // HTML made in the kernel (names escaped there)
  for (const [name, node] of Object.entries(parts)) {
    const show = () => (node.innerHTML = model.get(name) as string);
    model.on(`change:${name}`, show);
    show();
  }
  const showNote = () => {
    note.textContent = model.get('note') as string;
    note.style.display = note.textContent ? '' : 'none';
  };
  model.on('change:note', showNote);
  showNote();

  const Plotly = await plotly(model);
  let drawn = false;
  let width = 0; // the width the figure was laid out for
  let stale = false; // points came while the figure was being drawn: draw again from the store
  const draw = async (): Promise<void> => {
    const figure = figureOf(model);
    if (!figure.data) {
      plot.style.display = 'none';
      return;
    }
    plot.style.display = '';
    stale = false;
    drawn = false;
    width = el.clientWidth;
    const layout = fit(figure.layout, width);
    await Plotly.react(plot, copy(stores.get(model.get('uid') as string)!.data), layout, CONFIG);
    drawn = true;
    if (stale) {
      void draw();
    }
  };
  // the panel or the notebook changed width (a split view opened, a sidebar closed): lay out again
  const resized = new ResizeObserver(() => {
    if (drawn && relayout(width, el.clientWidth)) {
      void draw();
    }
  });
  resized.observe(el);
  const onMessage = (msg: IMessage) => {
    if (!msg.extend) {
      return;
    }
    if (!drawn) {
      stale = true;
    } else {
      Plotly.extendTraces(plot, { x: msg.extend.x, y: msg.extend.y }, msg.extend.indices);
    }
  };
  model.on('change:figure', draw);
  model.on('msg:custom', onMessage);
  await draw();
  return () => {
    resized.disconnect();
    Plotly.purge(plot);
  };
}

const dashboard: IDashboardModule = { initialize, render };
export default dashboard;
