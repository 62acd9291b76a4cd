// The live training dashboard in the page: an anywidget module (kernel side: view.py, live_dashboard.py).
//
// The kernel sends the whole figure only when it is built or its older points were thinned
// (trait `figure`); new points come as small "extend" messages, appended with Plotly.extendTraces,
// about once a second. plotly.js comes from the kernel's plotly package, once per page: no CDN.

const stores = new Map(); // uid -> {data}: every point so far, for views made after some were sent
const copy = (data) => data.map((t) => ({ ...t, x: [...t.x], y: [...t.y] }));
// staticPlot: no hover or zoom layers to rebuild at every redraw (the figure left when the run ends has them)
const CONFIG = { staticPlot: true };
// Below this width (a notebook beside a docked dashboard, a narrow panel) the throughput plot goes under
// the loss plot instead of beside it.
const NARROW_PX = 560;
const STACKED_EXTRA_PX = 200;

// The kernel's layout, for the width there is: as it is, or stacked when narrow.
function fit(layout, width) {
  if (!width) return layout; // not laid out yet (a hidden panel): plotly's own size
  if (!layout.xaxis2 || width >= NARROW_PX) return { ...layout, width };
  return {
    ...layout,
    width,
    height: layout.height + STACKED_EXTRA_PX,
    xaxis: { ...layout.xaxis, domain: [0, 1] },
    yaxis: { ...layout.yaxis, domain: [0.56, 1] },
    xaxis2: { ...layout.xaxis2, domain: [0, 1] },
    yaxis2: { ...layout.yaxis2, domain: [0, 0.36] },
    legend: { ...layout.legend, y: -0.2 },
  };
}

function plotly(model) {
  if (!globalThis.__workbenchPlotly) {
    globalThis.__workbenchPlotly = (async () => {
      if (globalThis.Plotly && globalThis.Plotly.extendTraces) return globalThis.Plotly;
      const library = await model.widget_manager.get_model(model.get("library"));
      const module = { exports: {} };
      new Function("module", "exports", new TextDecoder().decode(library.get("code")))(module, module.exports);
      return module.exports;
    })().catch((err) => {
      globalThis.__workbenchPlotly = null; // the next view tries again
      throw err;
    });
  }
  return globalThis.__workbenchPlotly;
}

function append(data, ext) {
  ext.indices.forEach((i, k) => {
    data[i].x.push(...ext.x[k]);
    data[i].y.push(...ext.y[k]);
  });
}

function initialize({ model }) {
  // the kernel hears that this page has the widget manager and this module: the widget can render here
  // (a front end without them never creates the model, and the kernel falls back to plain HTML updates)
  if (typeof model.send === "function") model.send({ alive: true });
  const uid = model.get("uid");
  const store = { data: copy(model.get("figure").data || []) };
  stores.set(uid, store);
  const onFigure = () => (store.data = copy(model.get("figure").data || []));
  const onMessage = (msg) => msg.extend && append(store.data, msg.extend);
  model.on("change:figure", onFigure);
  model.on("msg:custom", onMessage);
  return () => stores.delete(uid);
}

async function render({ model, el }) {
  el.classList.add("workbench-dashboard");
  el.style.width = "100%";
  el.style.contain = "content"; // its redraws never make the browser lay out the rest of the notebook
  el.innerHTML =
    "<div class='workbench-dashboard-header'></div>" +
    "<div class='workbench-dashboard-note' style='padding:1em 0;color:#555'></div>" +
    "<div class='workbench-loss-plot'></div><div class='workbench-device-panel'></div>" +
    "<div class='workbench-bars'></div>";
  const [header, note, plot, devices, bars] = el.children;
  const parts = { header, devices, bars }; // HTML made in the kernel (names escaped there)
  for (const [name, node] of Object.entries(parts)) {
    const show = () => (node.innerHTML = model.get(name));
    model.on(`change:${name}`, show);
    show();
  }
  const showNote = () => {
    note.textContent = model.get("note");
    note.style.display = note.textContent ? "" : "none";
  };
  model.on("change:note", showNote);
  showNote();

  const Plotly = await plotly(model);
  let drawn = false;
  let width = 0; // the width the figure was laid out for
  let stale = false; // points came while the figure was being drawn: draw again from the store
  const draw = async () => {
    const figure = model.get("figure");
    if (!figure.data) {
      plot.style.display = "none";
      return;
    }
    plot.style.display = "";
    stale = false;
    drawn = false;
    width = el.clientWidth;
    const layout = fit(figure.layout, width);
    await Plotly.react(plot, copy(stores.get(model.get("uid")).data), layout, CONFIG);
    drawn = true;
    if (stale) draw();
  };
  // the panel or the notebook changed width (a split view opened, a sidebar closed): lay out again
  const resized = new ResizeObserver(() => {
    if (drawn && el.clientWidth > 0 && Math.abs(el.clientWidth - width) > 4) draw();
  });
  resized.observe(el);
  const onMessage = (msg) => {
    if (!msg.extend) return;
    if (!drawn) stale = true;
    else Plotly.extendTraces(plot, { x: msg.extend.x, y: msg.extend.y }, msg.extend.indices);
  };
  model.on("change:figure", draw);
  model.on("msg:custom", onMessage);
  await draw();
  return () => {
    resized.disconnect();
    Plotly.purge(plot);
  };
}

export default { initialize, render };
