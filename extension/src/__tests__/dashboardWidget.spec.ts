import dashboard, {
  append,
  copy,
  fit,
  ILayout,
  ITrace,
  NARROW_PX,
  relayout,
  STACKED_EXTRA_PX
} from '../widget/dashboard';

const LAYOUT: ILayout = {
  height: 300,
  xaxis: { domain: [0, 0.48], title: 'step' },
  yaxis: { domain: [0, 1] },
  xaxis2: { domain: [0.52, 1] },
  yaxis2: { domain: [0, 1] },
  legend: { orientation: 'h', y: -0.3 }
};

describe("the dashboard's module (workbench/widgets/dashboard.js)", () => {
  it('is an anywidget module: a default export with initialize and render', () => {
    expect(typeof dashboard.initialize).toBe('function');
    expect(typeof dashboard.render).toBe('function');
  });

  it('copies the points it hands to plotly (plotly keeps and extends what it is given)', () => {
    const data: ITrace[] = [{ x: [1, 2], y: [0.9, 0.8], name: 'loss' }];
    const copied = copy(data);
    expect(copied).toEqual(data);
    copied[0].x.push(3);
    expect(data[0].x).toEqual([1, 2]);
  });

  it('appends the points of an extend message to their traces', () => {
    const data: ITrace[] = [
      { x: [1], y: [0.9] },
      { x: [1], y: [100] }
    ];
    append(data, { indices: [1, 0], x: [[2, 3], [2]], y: [[110, 120], [0.8]] });
    expect(data).toEqual([
      { x: [1, 2], y: [0.9, 0.8] },
      { x: [1, 2, 3], y: [100, 110, 120] }
    ]);
  });

  it('lays the kernel\'s figure out for the width there is, the plots stacked when narrow', () => {
    // hidden (no width yet): plotly's own size
    expect(fit(LAYOUT, 0)).toBe(LAYOUT);
    // wide: side by side, as the kernel laid them out
    expect(fit(LAYOUT, NARROW_PX)).toEqual({ ...LAYOUT, width: NARROW_PX });
    // narrow: the throughput plot under the loss plot, taller by the room it takes, the legend below both
    const narrow = fit(LAYOUT, NARROW_PX - 1)!;
    expect(narrow.width).toBe(NARROW_PX - 1);
    expect(narrow.height).toBe(300 + STACKED_EXTRA_PX);
    expect([narrow.xaxis?.domain, narrow.yaxis?.domain]).toEqual([[0, 1], [0.56, 1]]);
    expect([narrow.xaxis2?.domain, narrow.yaxis2?.domain]).toEqual([[0, 1], [0, 0.36]]);
    expect(narrow.xaxis?.title).toBe('step');
    expect(narrow.legend).toEqual({ orientation: 'h', y: -0.2 });
    expect(LAYOUT.xaxis?.domain).toEqual([0, 0.48]); // the kernel's layout is left as it was
    // one plot only: never stacked
    const single: ILayout = { height: 300, xaxis: {}, yaxis: {} };
    expect(fit(single, 200)).toEqual({ ...single, width: 200 });
  });

  it('lays out again when the width changed by more than a scroll bar, never while hidden', () => {
    expect(relayout(800, 400)).toBe(true);
    expect(relayout(800, 796)).toBe(false);
    expect(relayout(800, 805)).toBe(true);
    expect(relayout(800, 0)).toBe(false);
  });
});
