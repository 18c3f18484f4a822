// megad's web view: the cluster (/) and one job (/jobs/ID), drawn with SVG
// from the read-only JSON API (README, "Web view"). Plain JavaScript, nothing
// fetched from elsewhere. User text (job names, messages) only ever becomes
// DOM text (textContent), never markup.
'use strict';

const SVGNS = 'http://www.w3.org/2000/svg';
const MAX_POINTS = 4000; // kept per curve; older points are thinned beyond it

function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'text') e.textContent = v;
    else if (v !== null && v !== undefined) e.setAttribute(k, v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}

function s(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmt(x, digits) {
  if (x === null || x === undefined || !isFinite(x)) return '–';
  const a = Math.abs(x);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return x.toExponential(2);
  return x.toFixed(digits === undefined ? (a >= 100 ? 0 : a >= 10 ? 1 : 3) : digits);
}

function fmtDur(sec) {
  if (!isFinite(sec) || sec < 0) return '–';
  if (sec < 1) return (sec * 1000).toFixed(1) + ' ms';
  if (sec < 90) return sec.toFixed(1) + ' s';
  if (sec < 5400) return (sec / 60).toFixed(1) + ' min';
  return (sec / 3600).toFixed(1) + ' h';
}

function fmtTime(ms) { return ms ? new Date(ms).toLocaleTimeString() : ''; }

function status(text) { document.getElementById('status').textContent = text; }

async function getJSON(url) {
  const r = await fetch(url, {cache: 'no-store'});
  if (!r.ok) {
    const text = (await r.text()).trim();
    throw Object.assign(new Error(url + ': ' + r.status + ' ' + text), {status: r.status, text});
  }
  return r.json();
}

function stateBadge(state) { return h('span', {class: 'state ' + state, text: state}); }

function worldText(j) {
  return j.world ? `${j.world} = TP ${j.tp} × PP ${j.pp} × DP ${j.dp}` +
      (j.vp > 1 ? ` (VP ${j.vp})` : '') : 'not placed';
}

function table(id, cols, rows) {
  const t = h('table', {id});
  t.append(h('tr', {}, ...cols.map(c => h('th', {text: c}))));
  for (const r of rows) t.append(r);
  return t;
}

// ---------------------------------------------------------------- cluster

function jobLink(id) { return h('a', {href: '/jobs/' + encodeURIComponent(id), text: id}); }

function renderCluster(c) {
  const main = document.getElementById('main');
  const nodes = c.nodes.map(n => h('tr', {class: 'node'},
      h('td', {text: (n.self ? '*' : '') + n.id}), h('td', {text: n.address}),
      h('td', {}, stateBadge(n.state)), h('td', {text: n.backend}), h('td', {text: n.devices}),
      h('td', {class: 'num', text: `${n.slots_used}/${n.slots}`}),
      h('td', {}, ...n.job_ids.flatMap((id, i) => i ? [', ', jobLink(id)] : [jobLink(id)]))));
  const jobs = c.jobs.map(j => h('tr', {class: 'job', 'data-job': j.id},
      h('td', {}, jobLink(j.id)), h('td', {class: 'name', text: j.name}), h('td', {}, stateBadge(j.state)),
      h('td', {text: worldText(j)}),
      h('td', {class: 'num', text: `${j.last_iteration}/${j.train_iters}`}),
      h('td', {class: 'num', text: fmt(j.loss)}),
      h('td', {class: 'num', text: fmt(j.tokens_per_s)})));
  main.replaceChildren(
      h('section', {}, h('h2', {text: 'Nodes'}),
        table('nodes', ['node', 'address', 'state', 'backend', 'devices', 'slots', 'jobs'], nodes)),
      h('section', {}, h('h2', {text: 'Jobs coordinated by ' + c.self}),
        jobs.length ? table('jobs', ['job', 'name', 'state', 'world', 'iteration', 'loss',
                                     'tokens/s'], jobs)
                    : h('p', {class: 'muted', text: 'No jobs yet: megactl submit ...'})));
}

async function clusterPage() {
  for (;;) {
    try {
      renderCluster(await getJSON('/api/cluster'));
      status('updated ' + new Date().toLocaleTimeString());
    } catch (e) { status(String(e.message)); }
    await new Promise(r => setTimeout(r, 2000));
  }
}

// ---------------------------------------------------------------- charts

// A line chart: series [{pts: [[x, y]], line: class, dot: class}], marks
// [{x, label}] as dashed verticals (restarts and rescales).
function lineChart(title, series, marks, opts) {
  const W = 600, H = opts.height || 200, L = 52, R = 10, T = 8, B = 22;
  const svg = s('svg', {viewBox: `0 0 ${W} ${H}`, class: 'chart', id: opts.id});
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity, n = 0;
  for (const se of series) for (const [x, y] of se.pts) {
    if (!isFinite(y)) continue;
    x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y); n++;
  }
  svg.setAttribute('data-n', String(series.length ? series[0].pts.length : 0));
  if (!n) {
    svg.append(s('text', {x: L, y: H / 2}, 'no ' + title + ' yet'));
    return svg;
  }
  if (opts.zero) y0 = Math.min(0, y0);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 += Math.abs(y1) * 0.05 || 1; y0 -= Math.abs(y0) * 0.05 || 0; }
  const X = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const Y = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  svg.append(s('line', {class: 'axis', x1: L, y1: H - B, x2: W - R, y2: H - B}),
             s('line', {class: 'axis', x1: L, y1: T, x2: L, y2: H - B}));
  for (let i = 0; i <= 4; i++) {
    const yv = y0 + (y1 - y0) * i / 4;
    svg.append(s('text', {x: L - 4, y: Y(yv) + 4, 'text-anchor': 'end'}, fmt(yv)));
    const xv = Math.round(x0 + (x1 - x0) * i / 4);
    svg.append(s('text', {x: X(xv), y: H - 6, 'text-anchor': 'middle'}, String(xv)));
  }
  for (const m of marks || []) {
    const g = s('g', {class: 'mark'});
    g.append(s('line', {x1: X(m.x), y1: T, x2: X(m.x), y2: H - B}),
             s('text', {x: X(m.x) + 3, y: T + 10}, m.label));
    svg.append(g);
  }
  for (const se of series) {
    // a line breaks where an attempt restarts (iterations repeat after it)
    let d = '', prev = null;
    for (const p of se.pts) {
      if (!isFinite(p[1])) { prev = null; continue; }
      const brk = !prev || p[2] !== prev[2];
      d += (brk ? 'M' : 'L') + X(p[0]).toFixed(1) + ' ' + Y(p[1]).toFixed(1);
      prev = p;
    }
    svg.append(s('path', {class: se.line, d}));
    if (se.dot && se.pts.length <= (se.maxDots || 600))
      for (const p of se.pts)
        if (isFinite(p[1]))
          svg.append(s('circle', {class: se.dot, cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1),
                                  r: se.r || 1.8, 'data-it': p[0]}));
  }
  return svg;
}

// Per stage: the measured bubble (warmup, steady, cooldown stacked, as
// fractions of the step) beside the closed form for the job's schedule.
function bubbleChart(stages, closed) {
  const rowH = 30, L = 52, W = 600, H = Math.max(1, stages.length) * rowH + 18;
  const svg = s('svg', {viewBox: `0 0 ${W} ${H}`, id: 'bubble-chart'});
  let top = 0.05;
  for (const st of stages) top = Math.max(top, st.bubble);
  for (const c of closed ? closed.stages : []) top = Math.max(top, c || 0);
  top = Math.min(1, Math.ceil(top * 10) / 10);
  const X = f => (f / top) * (W - L - 60);
  stages.forEach((st, i) => {
    const y = i * rowH;
    svg.append(s('text', {x: 0, y: y + 13}, 'stage ' + st.stage));
    const g = s('g', {class: 'stage-bar', 'data-stage': st.stage});
    let x = L;
    const parts = st.split ? [['warmup', st.warmup], ['steady', st.steady],
                              ['cooldown', st.cooldown]] : [['bubble-all', st.bubble]];
    for (const [cls, f] of parts) {
      const w = X(f);
      g.append(s('rect', {class: cls, x: x.toFixed(1), y, width: w.toFixed(1), height: 13},
                 undefined));
      g.lastChild.append(s('title', {}, `${cls} ${(100 * f).toFixed(1)}%`));
      x += w;
    }
    g.append(s('text', {x: x + 4, y: y + 11}, (100 * st.bubble).toFixed(1) + '%'));
    svg.append(g);
    const c = closed && closed.stages[st.stage];
    if (c !== undefined && c !== null) {
      svg.append(s('rect', {class: 'closed-bar', x: L, y: y + 15, width: X(c).toFixed(1),
                            height: 8, 'data-stage': st.stage}));
      svg.append(s('text', {x: L + X(c) + 4, y: y + 23}, (100 * c).toFixed(1) + '% closed'));
    }
  });
  svg.append(s('text', {x: L, y: H - 2}, '0'),
             s('text', {x: L + X(top), y: H - 2, 'text-anchor': 'end'},
               (100 * top).toFixed(0) + '% of the step'));
  return svg;
}

// Stages from the last step's ranks: the mean over each stage's DP x TP ranks.
function stagesOf(step) {
  const by = new Map();
  for (const r of step ? step.ranks : []) {
    const d = r.step_time_s;
    if (!(d > 0)) continue;
    const st = by.get(r.pp_rank) || {stage: r.pp_rank, n: 0, bubble: 0, warmup: 0, steady: 0,
                                     cooldown: 0, split: false, gs: 0};
    const c = f => Math.min(Math.max(f / d, 0), 1);
    st.bubble += c(r.bubble_s); st.warmup += c(r.bubble_warmup_s);
    st.steady += c(r.bubble_steady_s); st.cooldown += c(r.bubble_cooldown_s);
    st.split = st.split || r.bubble_warmup_s > 0 || r.bubble_steady_s > 0 ||
        r.bubble_cooldown_s > 0;
    st.gs = Math.max(st.gs, r.grad_sync_exposed_s || 0);
    st.n++;
    by.set(r.pp_rank, st);
  }
  const out = [...by.values()].sort((a, b) => a.stage - b.stage);
  for (const st of out) for (const k of ['bubble', 'warmup', 'steady', 'cooldown']) st[k] /= st.n;
  return out;
}

// The pipeline timeline of --trace-iteration from its Chrome trace.
function timeline(trace) {
  const evs = (trace.traceEvents || []).filter(e => e.ph === 'X');
  const names = new Map();
  for (const e of trace.traceEvents || [])
    if (e.ph === 'M' && e.name === 'thread_name') names.set(e.tid, e.args.name);
  const tids = [...new Set(evs.map(e => e.tid))].sort((a, b) => a - b);
  let t0 = Infinity, t1 = -Infinity; // no spread: a trace may hold 100,000 spans
  for (const e of evs) { t0 = Math.min(t0, e.ts); t1 = Math.max(t1, e.ts + e.dur); }
  const rowH = 22, L = 150, W = 1000, H = tids.length * rowH + 20;
  const svg = s('svg', {viewBox: `0 0 ${W} ${H}`, id: 'timeline-svg'});
  const X = t => L + (t - t0) / Math.max(t1 - t0, 1) * (W - L - 5);
  const color = e => e.cat === 'compute' ? ({F: '#4c8bf5', B: '#2f9e44', W: '#12b886'}[e.name[0]] ||
                     '#4c8bf5') : ({p2p: '#f08c00', bubble: '#dee2e6', grad_sync: '#7048e8',
                     optimizer: '#a0522d'}[e.cat] || '#adb5bd');
  tids.forEach((tid, i) => {
    const y = i * rowH;
    svg.append(s('text', {x: 0, y: y + 14}, names.get(tid) || 'rank ' + tid));
    for (const e of evs) {
      if (e.tid !== tid) continue;
      const r = s('rect', {class: 'span ' + e.cat, x: X(e.ts).toFixed(2), y: y + 2,
                           width: Math.max(X(e.ts + e.dur) - X(e.ts), 0.5).toFixed(2),
                           height: rowH - 6, fill: color(e)});
      r.append(s('title', {}, `${e.name} (${e.cat}) ${(e.dur / 1000).toFixed(2)} ms`));
      svg.append(r);
    }
  });
  svg.append(s('text', {x: L, y: H - 2}, '0'),
             s('text', {x: W - 5, y: H - 2, 'text-anchor': 'end'},
               ((t1 - t0) / 1000).toFixed(1) + ' ms'));
  return svg;
}

// ---------------------------------------------------------------- one job

// Keeps at most MAX_POINTS: every second point of the older half goes, as
// megad thins its own ring, but eval points and attempts' starts stay.
function thin(pts) {
  if (pts.length <= MAX_POINTS) return pts;
  const half = pts.length >> 1, out = [];
  for (let i = 0; i < half; i++)
    if (i % 2 === 0 || pts[i].eval_loss !== undefined ||
        (i && pts[i].attempt !== pts[i - 1].attempt)) out.push(pts[i]);
  return out.concat(pts.slice(half));
}

function eta(job, pts) {
  // from the recent rate of the current attempt
  const cur = pts.filter(p => p.attempt === job.attempt).slice(-50);
  if (cur.length < 2 || job.train_iters <= job.last_iteration) return null;
  const a = cur[0], b = cur[cur.length - 1];
  const rate = (b.it - a.it) / ((b.t - a.t) / 1000);
  return rate > 0 ? (job.train_iters - job.last_iteration) / rate : null;
}

function renderJob(view) {
  const {job, pts, marks} = view;
  const main = document.getElementById('main');
  const last = pts.length ? pts[pts.length - 1] : null;
  const pct = job.train_iters ? Math.min(100, 100 * job.last_iteration / job.train_iters) : 0;
  const e = mega_final(job.state) ? null : eta(job, pts);
  const head = h('section', {id: 'job-header'},
      h('h1', {}, h('span', {id: 'job-id', text: 'job ' + job.id}), ' ',
        h('span', {id: 'job-name', text: job.name}), ' ', stateBadge(job.state)),
      h('div', {class: 'facts'},
        h('span', {}, 'world ', h('b', {text: worldText(job)})),
        h('span', {}, 'attempt ', h('b', {text: String(job.attempt)}),
          ` (restarts ${job.restarts}/${job.max_restarts})`),
        h('span', {}, 'iteration ', h('b', {text: `${job.last_iteration}/${job.train_iters}`})),
        h('span', {}, 'ETA ', h('b', {text: e === null ? '–' : fmtDur(e)})),
        h('span', {}, 'loss ', h('b', {text: fmt(job.loss)})),
        h('span', {}, 'tokens/s ', h('b', {id: 'tps', text: fmt(job.tokens_per_s)})),
        h('span', {}, 'step ', h('b', {text: fmtDur(job.step_time_s)})),
        job.checkpoint_iteration ? h('span', {}, 'checkpoint ',
                                     h('b', {text: String(job.checkpoint_iteration)})) : null),
      h('div', {class: 'progress'}, h('div', {style: `width:${pct.toFixed(1)}%`})),
      job.error ? h('div', {class: 'error', text: job.error}) : null);

  const mk = marks.map(m => ({x: m.it, label: m.kind === 'rescale' ?
      `rescale ${m.prev_world}→${m.world}` : `restart (attempt ${m.attempt})`}));
  const lossPts = pts.map(p => [p.it, p.loss === null ? NaN : p.loss, p.attempt]);
  const evalPts = pts.filter(p => p.eval_loss !== undefined)
      .map(p => [p.it, p.eval_loss === null ? NaN : p.eval_loss, p.attempt]);
  const loss = h('section', {id: 'loss'}, h('h2', {text: 'Loss'}),
      h('div', {class: 'legend'}, h('span', {}, h('i', {style: 'background:var(--loss)'}), 'train'),
        evalPts.length ? h('span', {}, h('i', {style: 'background:var(--eval)'}), 'eval') : null,
        marks.length ? h('span', {}, h('i', {style: 'background:var(--mark)'}),
                         'restart / rescale') : null,
        view.thinned ? h('span', {text: 'older points thinned'}) : null,
        view.skipped ? h('span', {id: 'skipped', text: `${view.skipped} points skipped ` +
                                  '(this page fell behind)'}) : null),
      lineChart('loss', [{pts: lossPts, line: 'loss-line', dot: 'loss-pt'},
                         {pts: evalPts, line: 'eval-line', dot: 'eval-pt', r: 3,
                          maxDots: 1e9}], mk, {id: 'loss-curve', height: 240}));
  const tps = h('section', {id: 'throughput'}, h('h2', {text: 'Tokens/s'}),
      lineChart('tokens/s', [{pts: pts.map(p => [p.it, p.tokens_per_s, p.attempt]),
                             line: 'tps-line'}], mk, {id: 'tps-curve', zero: true}));

  const stages = stagesOf(job.last_step);
  const cf = job.closed_form;
  const bub = h('section', {id: 'bubbles'}, h('h2', {text: 'Bubble per stage' +
      (job.last_step ? ` (iteration ${job.last_step.iteration})` : '')}),
      h('div', {class: 'legend'},
        h('span', {}, h('i', {style: 'background:var(--warm)'}), 'warmup'),
        h('span', {}, h('i', {style: 'background:var(--steady)'}), 'steady'),
        h('span', {}, h('i', {style: 'background:var(--cool)'}), 'cooldown'),
        h('span', {}, h('i', {style: 'background:var(--closed)'}), 'closed form')),
      cf ? h('div', {class: 'legend', id: 'closed-form',
                     text: `closed form: ${cf.schedule}, P=${cf.pp}, V=${cf.vp}, ` +
                           `M=${cf.microbatches}, T_f=${cf.t_forward} T_b=${cf.t_backward} ` +
                           `T_w=${cf.t_weight}: mean ${(100 * cf.bubble_fraction).toFixed(1)}%`})
         : null,
      stages.length ? bubbleChart(stages, cf)
                    : h('p', {class: 'muted', text: 'no step reported yet'}));

  const gsRows = stages.map(st => h('tr', {}, h('td', {text: 'stage ' + st.stage}),
      h('td', {class: 'num', text: fmtDur(st.gs)})));
  const gs = h('section', {id: 'gradsync'}, h('h2', {text: 'Gradient sync exposed'}),
      lineChart('grad sync', [{pts: pts.map(p => [p.it, p.grad_sync_s * 1000, p.attempt]),
                               line: 'gs-line'}], mk, {id: 'gs-curve', zero: true, height: 160}),
      h('div', {class: 'muted', text: 'ms per iteration, the most any rank waited'}),
      stages.length ? table('gs-table', ['stage', 'exposed (last step)'], gsRows) : null);

  const tl = h('section', {id: 'timeline'}, h('h2', {text: 'Pipeline timeline'}));
  if (view.trace) {
    tl.append(h('div', {class: 'legend'}, 'iteration ' + job.trace_iteration + ' · ',
        h('a', {id: 'trace-link', href: '/api/jobs/' + encodeURIComponent(job.id) + '/trace',
                download: `trace-${job.id}.json`, text: 'download the Chrome trace (Perfetto)'})),
        view.traceSvg || (view.traceSvg = timeline(view.trace))); // drawn once
  } else {
    tl.append(h('p', {class: 'muted', id: 'no-trace', text: !job.trace_iteration ?
        'submit the job with --trace-iteration K to see one iteration here' : view.noTrace ?
        `the job ended (${job.state}) without a trace of iteration ${job.trace_iteration}` :
        `waiting for iteration ${job.trace_iteration}'s trace`}));
  }

  // newest first; megad keeps a job's first and newest events, and where
  // numbers jump the ones between were left out: a row says how many
  const evRows = [];
  for (let i = job.events.length - 1; i >= 0; i--) {
    const ev = job.events[i];
    evRows.push(h('tr', {class: 'event'},
        h('td', {text: fmtTime(ev.time_ms)}), h('td', {text: ev.kind}),
        h('td', {class: 'num', text: String(ev.attempt)}),
        h('td', {text: ev.node + (ev.rank !== null ? ' rank ' + ev.rank : '')}),
        h('td', {text: ev.message})));
    const before = i ? job.events[i - 1].number : 0;
    if (ev.number && ev.number > before + 1) {
      const n = ev.number - before - 1;
      evRows.push(h('tr', {class: 'event gap'}, h('td', {}), h('td', {}), h('td', {}), h('td', {}),
          h('td', {class: 'muted', text: `… ${n} event${n === 1 ? '' : 's'} left out …`})));
    }
  }
  const evs = h('section', {id: 'events'}, h('h2', {text: 'Events'}),
      table('events-table', ['time', 'kind', 'attempt', 'where', 'message'], evRows));
  evs.lastChild.classList.add('events');

  main.replaceChildren(head, h('div', {class: 'row'}, loss, tps), h('div', {class: 'row'}, bub, gs),
                       tl, evs);
  document.getElementById('where').textContent = 'job ' + job.id;
  document.title = 'mega · ' + job.id + (job.name ? ' ' + job.name : '');
  if (last) document.body.setAttribute('data-iteration', String(last.it));
  // when the first full view was drawn, for bench/web_view.sh
  if (!document.body.hasAttribute('data-first-render-ms'))
    document.body.setAttribute('data-first-render-ms', performance.now().toFixed(0));
}

function mega_final(state) {
  return ['succeeded', 'failed', 'cancelled', 'stopped'].includes(state);
}

// Live: an EventSource on /api/jobs/ID/stream (Server-Sent Events: new
// points, the job when it changed, the end). Where the stream is refused
// (megad's cap on streams) or EventSource is missing, it polls
// steps?since=next once a second instead.
function jobPage(id) {
  const base = '/api/jobs/' + encodeURIComponent(id);
  const view = {job: null, pts: [], marks: [], next: 0, thinned: 0, skipped: 0, trace: null,
                traceSvg: null, tracing: false, noTrace: false};
  let drawTimer = null;
  const draw = () => { // at most five renders a second, however fast the news
    if (drawTimer !== null) return;
    drawTimer = setTimeout(() => {
      drawTimer = null;
      if (view.job) renderJob(view);
    }, view.job && document.body.hasAttribute('data-first-render-ms') ? 200 : 0);
  };
  const addSteps = st => {
    // our cursor was another curve's (megad restarted, the job's record was
    // made anew): this is the whole new curve
    if (st.reset) { view.pts = []; view.marks = []; view.thinned = false; view.skipped = 0; }
    view.pts = thin(view.pts.concat(st.points));
    view.marks = view.marks.concat(st.marks);
    view.thinned = view.thinned || st.thinned > 0 || st.skipped > 0;
    view.next = st.next;
  };
  const setJob = async j => {
    view.job = j;
    if (!view.trace && !view.tracing && j.trace_iteration &&
        (j.last_iteration >= j.trace_iteration || mega_final(j.state))) {
      view.tracing = true;
      try {
        const r = await fetch(base + '/trace', {cache: 'no-store'});
        if (r.ok) view.trace = await r.json();
        else view.noTrace = r.status === 404 && mega_final(j.state); // it never will
      } catch (e) { /* the next job update tries again */ }
      view.tracing = false;
    }
    draw();
  };
  const live = how => document.body.setAttribute('data-live', how);

  // no such job here, one another node coordinates (etcd mode) or a
  // malformed id: megad's words, and no more asking
  const missing = e => {
    live('missing');
    status('job ' + id + ' is not here');
    document.getElementById('where').textContent = 'job ' + id;
    document.getElementById('main').replaceChildren(h('section', {id: 'no-job'},
        h('h1', {text: 'job ' + id + ' is not here'}), h('p', {text: e.text}),
        h('p', {}, h('a', {href: '/', text: 'the jobs this megad coordinates'}))));
  };

  async function poll() {
    live('poll');
    for (let tick = 0;; tick++) {
      try {
        const st = await getJSON(base + '/steps?since=' + view.next);
        addSteps(st);
        if (!view.job || tick % 2 === 0 || st.points.length) await setJob(await getJSON(base));
        status('updated ' + new Date().toLocaleTimeString() + ' (polling)');
        if (mega_final(view.job.state) && !st.points.length) {
          status(view.job.state + ' · final');
          return;
        }
      } catch (e) {
        if (!view.job && (e.status === 404 || e.status === 400)) return missing(e);
        status(String(e.message));
      }
      await new Promise(r => setTimeout(r, 1000));
    }
  }

  if (!window.EventSource) return poll();
  // a reconnect resumes from the last steps event's id (Last-Event-ID)
  const es = new EventSource(base + '/stream?since=' + view.next);
  let opened = false;
  es.onopen = () => { opened = true; live('sse'); status('live'); };
  es.addEventListener('steps', e => { addSteps(JSON.parse(e.data)); draw(); });
  es.addEventListener('skipped', e => { view.skipped += JSON.parse(e.data).missed; });
  es.addEventListener('job', e => {
    setJob(JSON.parse(e.data));
    status('live · updated ' + new Date().toLocaleTimeString());
  });
  es.addEventListener('end', e => {
    es.close();
    live('ended');
    status(JSON.parse(e.data).state + ' · final');
  });
  es.onerror = () => {
    if (es.readyState !== EventSource.CLOSED) { status('reconnecting…'); return; }
    if (!opened || !view.job || !mega_final(view.job.state)) poll(); // refused: poll instead
  };
}

// The logout button, where a login guards the page.
async function loginBar() {
  try {
    if ((await getJSON('/api/cluster')).login) document.getElementById('logout').hidden = false;
  } catch (e) { /* the page says what failed elsewhere */ }
}

// A job id from the page's path: as typed where it is not valid
// percent-encoding (decodeURIComponent would throw and stop the page).
function pathJobId(path) {
  try { return decodeURIComponent(path); } catch (e) { return path; }
}

loginBar();
if (location.pathname.startsWith('/jobs/'))
  jobPage(pathJobId(location.pathname.slice('/jobs/'.length)));
else
  clusterPage();
