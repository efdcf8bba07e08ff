// salt-volumes web UI: plain JavaScript, no build step, no external assets.
// Everything live comes from the watch stream (server-sent events).
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = {
  token: sessionStorage.getItem("salt-volumes-token") || "",
  volumes: new Map(),
  nodes: [],
  sort: { key: "name", dir: 1 },
  nodeSort: { key: "name", dir: 1 },
  filter: "",
  nodeFilter: "", // the all-volumes view's node and phase filters
  phaseFilter: "",
  es: null,
  cloneFrom: null, // the snapshot the clone form is for
  restoreOf: null, // the volume and snapshot the restore dialog is for
};

const UNITS = { "": 1, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18,
  Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60 };

function parseSize(s) {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$/.exec(s.trim());
  return m ? Number(m[1]) * UNITS[m[2] || ""] : NaN;
}

function formatSize(n) {
  if (!n) return "";
  for (const u of ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"]) {
    if (n >= UNITS[u] && n % UNITS[u] === 0) return n / UNITS[u] + u;
  }
  for (const u of ["Ti", "Gi", "Mi", "Ki"]) {
    if (n >= UNITS[u]) return (n / UNITS[u]).toFixed(1) + u;
  }
  return String(n);
}

// when is the one way the UI writes a moment: the browser's local date and
// time, to the second, and how long ago.
function when(iso) {
  if (!iso || iso.startsWith("0001")) return "";
  const t = new Date(iso);
  if (isNaN(t)) return "";
  return `${t.toLocaleString()} (${age(iso)} ago)`;
}

// until is how long until a moment to come, as age writes one past.
function until(iso) {
  const s = Math.max(0, (Date.parse(iso) - Date.now()) / 1000);
  if (s < 60) return Math.floor(s) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 172800) return Math.floor(s / 3600) + "h";
  return Math.floor(s / 86400) + "d";
}

function age(iso) {
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return Math.floor(s) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 172800) return Math.floor(s / 3600) + "h";
  return Math.floor(s / 86400) + "d";
}

async function api(method, path, body) {
  const opts = { method, headers: { Authorization: "Bearer " + state.token } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(path, opts);
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  return { ok: resp.ok, status: resp.status, data };
}

// refusal is what the control plane said when it refused: its message
// names the field and the fix.
function refusal(r) {
  return (r.data && r.data.error && r.data.error.message) || "The control plane refused (HTTP " + r.status + ").";
}

// may says whether the caller's role allows what needs role need. Until
// whoami answers nothing that changes anything shows (a viewer would see
// the buttons come and go). A Kubernetes identity has no role here: RBAC
// decides each request, so it sees every action and a refusal says why.
const RANKS = { viewer: 1, operator: 2, admin: 3 };
function may(need) {
  if (!state.who) return false;
  const r = RANKS[state.who.role];
  return !r || r >= RANKS[need];
}

// roleNote says why a viewer sees no buttons ("" for anyone else).
function roleNote() {
  return state.who && state.who.role === "viewer" ?
    `You are signed in as ${state.who.user}, a viewer: creating, changing, restoring and deleting volumes and snapshots needs role operator.` : "";
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

// setText writes a text only when it changed: a live region written
// again with the same words is read again by some screen readers.
function setText(sel, text) {
  const e = typeof sel === "string" ? $(sel) : sel;
  if (e.textContent !== text) e.textContent = text;
}

// rowKey names a table row across redraws: its volume, node, snapshot
// or token.
function rowKey(tr) {
  const d = tr.dataset;
  return d.volume || d.node || d.snapshot || d.token || null;
}

// keepFocus makes a table's rows again (rebuild) and gives the keyboard's
// focus back to the same control of the same row (its data-role), if it
// was on one: a redraw would otherwise drop it to the page's start.
function keepFocus(tbody, rebuild) {
  const had = document.activeElement;
  const tr = had && had !== document.body && tbody.contains(had) ? had.closest("tr") : null;
  const key = tr ? rowKey(tr) : null;
  const role = had && had.dataset ? had.dataset.role : undefined;
  rebuild();
  if (!key || !role) return;
  const again = [...tbody.rows].find((r) => rowKey(r) === key);
  const e = again && again.querySelector(`[data-role="${role}"]`);
  if (e && document.activeElement !== e) e.focus();
}

// The opener of the dialog that is open, to give the focus back to when
// it closes (its row's control found again if the row was redrawn).
function rememberOpener() {
  const had = document.activeElement;
  const tr = had && had.closest ? had.closest("tr") : null;
  state.opener = { el: had, key: tr ? rowKey(tr) : null, table: tr ? tr.closest("tbody") : null, role: had && had.dataset ? had.dataset.role : undefined };
}

function returnFocus() {
  const o = state.opener;
  state.opener = null;
  if (!o) return;
  if (o.el && o.el.isConnected && !o.el.closest("[hidden]")) { o.el.focus(); return; }
  if (o.key && o.role && o.table && o.table.isConnected) {
    const again = [...o.table.rows].find((r) => rowKey(r) === o.key);
    const e = again && again.querySelector(`[data-role="${o.role}"]`);
    if (e) { e.focus(); return; }
  }
  focusHeading();
}

// focusHeading moves the focus to the shown page's heading (after a page
// change, or when what had it is gone), so a screen reader says where
// it is; the title names the page too.
function focusHeading() {
  const s = [...document.querySelectorAll("main > section")].find((x) => !x.hidden);
  const h = s && s.querySelector("h2");
  if (h) h.focus();
}

function pageTitle() {
  const what = !state.token ? "Sign in" : state.volume ? "Volume " + state.volume
    : state.page ? { snapshots: "Snapshots", audit: "Audit trail", tokens: "Tokens" }[state.page]
      : state.node === ALL ? "All volumes" : state.node ? "Node " + state.node : "Nodes";
  return what + " · salt-volumes";
}

function show(id) {
  for (const s of ["#login", "#nodes-view", "#node-view", "#volume-view", "#snapshots-view", "#audit-view", "#tokens-view"]) $(s).hidden = s !== id;
  $("#nav").hidden = id === "#login";
  const here = id === "#nodes-view" ? "#nav-nodes" : id === "#node-view" && state.node === ALL ? "#nav-volumes"
    : id === "#snapshots-view" ? "#nav-snapshots" : id === "#audit-view" ? "#nav-audit" : id === "#tokens-view" ? "#nav-tokens" : "";
  for (const a of ["#nav-nodes", "#nav-volumes", "#nav-snapshots", "#nav-audit", "#nav-tokens"]) {
    if (a === here) $(a).setAttribute("aria-current", "page");
    else $(a).removeAttribute("aria-current");
  }
}

// ALL is the all-volumes view's node: every node's volumes in one table.
const ALL = "*";

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

// ---- watch stream ---------------------------------------------------------

// The stream takes a one-time ticket in its URL, never the token
// (EventSource sends no header): a new ticket for every connection, so
// reconnects are ours, not the browser's (a ticket is spent on first use).
async function connect() {
  if (state.es) state.es.close();
  clearTimeout(state.retry);
  if (!state.token) return;
  let r = null;
  try { r = await api("POST", "/api/v1/watch/ticket"); } catch (e) { r = null; }
  if (r && r.status === 401) return logout("The token was refused.");
  if (!r || !r.ok || !r.data || !r.data.ticket) {
    setText("#conn", "reconnecting…");
    state.retry = setTimeout(connect, 2000);
    return;
  }
  const ticket = r.data.ticket;
  const es = new EventSource("/api/v1/watch?ticket=" + encodeURIComponent(ticket));
  state.es = es;
  let fresh = new Map();
  let synced = false;
  const apply = (type) => (msg) => {
    const ev = JSON.parse(msg.data);
    const v = ev.volume;
    if (!synced) { fresh.set(v.spec.name, v); return; }
    if (type === "DELETED") state.volumes.delete(v.spec.name);
    else state.volumes.set(v.spec.name, v);
    if (state.volume === v.spec.name) refreshDetail();
    // The snapshots, audit and tokens pages show no volume: redrawing
    // them would move the keyboard's focus for nothing.
    if (!state.page) renderSoon();
  };
  es.addEventListener("ADDED", apply("ADDED"));
  es.addEventListener("MODIFIED", apply("MODIFIED"));
  es.addEventListener("DELETED", apply("DELETED"));
  es.addEventListener("SYNCED", () => {
    synced = true;
    state.volumes = fresh;
    fresh = new Map();
    setText("#conn", "live");
    render();
  });
  es.onerror = () => {
    // The list is sent again on the next connection, with a new ticket.
    es.close();
    if (state.es !== es) return;
    setText("#conn", "reconnecting…");
    state.retry = setTimeout(connect, 1000);
  };
}

// ---- views ----------------------------------------------------------------

// decoded is a name from the address; a malformed escape stays as typed
// (the page then says there is no such volume or node).
function decoded(s) {
  try { return decodeURIComponent(s); } catch (e) { return s; }
}

function route() {
  if (!state.token) {
    show("#login");
    document.title = pageTitle();
    $("#l-user").focus();
    return;
  }
  const m = /^#\/node\/(.+)$/.exec(location.hash);
  const all = location.hash === "#/volumes";
  const page = { "#/snapshots": "snapshots", "#/audit": "audit", "#/tokens": "tokens" }[location.hash] || null;
  state.page = page;
  const mv = /^#\/volume\/(.+)$/.exec(location.hash);
  state.volume = null;
  if (mv) {
    state.node = undefined;
    state.volume = decoded(mv[1]);
    state.detail = { usage: null, samples: [], jobs: [] };
    // Nothing typed for another volume stays in this one's forms.
    state.scheduleShown = null;
    for (const id of ["#schedule-every", "#schedule-keep", "#schedule-max-age", "#snapshot-name", "#snapshot-size", "#clone-name", "#grow-size"]) $(id).value = "";
    for (const id of ["#m-schedule", "#m-snapshot", "#m-clone", "#m-grow", "#vol-error"]) $(id).textContent = "";
    show("#volume-view");
    refreshDetail();
  } else if (page) { state.node = undefined; show("#" + page + "-view"); loadPage(); }
  else if (all) { state.node = ALL; show("#node-view"); loadNodes(); }
  else if (m) { state.node = decoded(m[1]); show("#node-view"); loadNodes(); }
  else { state.node = null; show("#nodes-view"); loadNodes(); }
  render();
  // A new page: its title, and the focus on its heading (the link that
  // had it is hidden with the page it was on).
  document.title = pageTitle();
  focusHeading();
}

// refreshDetail reloads the detail page's usage history and jobs, at most
// once per half second however many watch events arrive.
function refreshDetail() {
  if (state.detailTimer) return;
  state.detailTimer = setTimeout(async () => {
    state.detailTimer = null;
    const name = state.volume;
    if (!name) return;
    const enc = encodeURIComponent(name);
    const [u, j, h, sn, sc] = await Promise.all([api("GET", "/api/v1/volumes/" + enc + "/usage"), api("GET", "/api/v1/volumes/" + enc + "/jobs"),
      api("GET", "/api/v1/volumes/" + enc + "/history"), api("GET", "/api/v1/volumes/" + enc + "/snapshots"),
      api("GET", "/api/v1/snapshot-schedules?volume=" + enc)]);
    if (u.status === 401) return logout("The token was refused.");
    if (name !== state.volume) return;
    state.detail = { usage: u.ok ? u.data.current : null, samples: u.ok ? u.data.samples : [], jobs: j.ok ? j.data.items : [],
      history: h.ok ? h.data.items : [], snapshots: sn.ok ? sn.data.items : [], schedules: sc.ok ? sc.data.items : [] };
    render();
    // A snapshot's job changes no volume, nor does a restore (the volume
    // stays Available throughout), so no watch event says when one ends:
    // look again each second while one runs.
    if (state.detail.snapshots.some((x) => x.phase === "Pending" || x.phase === "Deleting" || restoringNow(x))) setTimeout(refreshDetail, 1000);
  }, 300);
}

async function loadNodes() {
  const r = await api("GET", "/api/v1/nodes");
  if (r.status === 401) return logout("The token was refused.");
  if (r.ok) {
    state.nodes = r.data.items;
    setText("#nodes-warning", r.data.warning || "");
    render();
  }
}

// renderSoon draws the page again within RENDER_EVERY ms, once however
// many watch events arrive meanwhile: a fleet's creates, or each copy's
// reports, come in bursts, and a table of thousands of rows drawn again
// per event kept the browser busy.
const RENDER_EVERY = 250;
function renderSoon() {
  if (state.renderTimer) return;
  state.renderTimer = setTimeout(() => {
    state.renderTimer = null;
    render();
  }, RENDER_EVERY);
}

function render() {
  clearTimeout(state.renderTimer);
  state.renderTimer = null;
  // Audit and tokens are an admin's: the links show once whoami says so.
  $("#nav-audit").hidden = $("#nav-tokens").hidden = !may("admin");
  if (state.page) renderPage();
  else if (state.volume) renderDetail();
  else if (state.node === null) renderNodes();
  else if (state.node !== undefined) renderVolumes();
}

// capBar draws a node's sparse capacity: the filesystem's size, what is
// used on it, and what the sparse volumes have committed (outlined; red
// past the overcommit limit).
function capBar(c) {
  const W = 160, H = 14;
  const full = Math.max(c.size, c.committed, 1);
  const x = (n) => Math.max(0, Math.min(W, (n / full) * W));
  const over = c.committed > c.overcommitRatio * c.size;
  const label = `committed ${formatSize(c.committed) || "0"} of ${formatSize(c.size)}, ${formatSize(c.free)} free` +
    (over ? ", past the overcommit limit" : "");
  const bar = svg("svg", { class: "capbar", width: W, height: H, viewBox: `0 0 ${W} ${H}`, "aria-hidden": "true" },
    svg("rect", { class: "cap-size", x: 0, y: 0, width: x(c.size), height: H }),
    svg("rect", { class: "cap-used", x: 0, y: 3, width: x(c.size - c.free), height: H - 6 }),
    svg("rect", { class: over ? "cap-over" : "cap-committed", x: 1, y: 1, width: Math.max(0, x(c.committed) - 2), height: H - 2 }));
  return el("span", {}, bar, el("span", { class: "caption", text: label }));
}

function beaconText(h) {
  if (!h || !h.lastReport || h.lastReport.startsWith("0001")) return el("span", { text: "no reports" });
  if (h.silent) return el("span", { class: "silent", text: "silent since " + age(h.lastReport) });
  if (h.error) return el("span", { class: "silent", text: "error: " + h.error });
  return el("span", { text: "reported " + age(h.lastReport) + " ago" });
}

function renderNodes() {
  const byNode = new Map();
  for (const n of state.nodes) byNode.set(n.name, { name: n.name, up: n.up, phases: {}, capacity: n.capacity, health: n.health });
  for (const v of state.volumes.values()) {
    const n = byNode.get(v.spec.node) || { name: v.spec.node, up: false, phases: {} };
    n.phases[v.status.phase] = (n.phases[v.status.phase] || 0) + 1;
    byNode.set(n.name, n);
  }
  const tbody = $("#nodes tbody");
  const rows = [...byNode.values()].map((n) => {
    const c = n.capacity;
    return Object.assign(n, {
      count: Object.values(n.phases).reduce((a, b) => a + b, 0),
      report: n.health && n.health.lastReport ? Date.parse(n.health.lastReport) : 0,
      sparseFree: c ? c.overcommitRatio * c.size - c.committed : -1,
      vgFree: c && c.vgs ? c.vgs.reduce((a, v) => a + v.free, 0) : -1,
      disks: c && c.disks ? c.disks.length : 0,
      orphans: n.health && n.health.orphans ? n.health.orphans.length : 0,
    });
  });
  const { key, dir } = state.nodeSort;
  const cmp = (a, b) => (typeof a === "string" ? a.localeCompare(b, undefined, { numeric: true }) : a - b);
  rows.sort((a, b) => dir * cmp(a[key], b[key]) || a.name.localeCompare(b.name, undefined, { numeric: true }));
  for (const b of document.querySelectorAll("#nodes th button")) {
    b.parentElement.setAttribute("aria-sort", b.dataset.nsort === key ? (dir > 0 ? "ascending" : "descending") : "none");
  }
  keepFocus(tbody, () => tbody.replaceChildren(...rows.map((n) => {
    const count = n.count;
    const phases = Object.entries(n.phases).map(([p, c]) => p + " " + c).join(", ");
    return el("tr", { "data-node": n.name },
      el("td", {}, el("a", { href: "#/node/" + encodeURIComponent(n.name), text: n.name, "data-role": "name" })),
      el("td", { text: n.up ? "up" : "not responding" }),
      el("td", { class: "beacon" }, beaconText(n.health)),
      el("td", { class: "capacity" }, n.capacity ? capBar(n.capacity) : "-"),
      el("td", { class: "vgs", title: vgText(n.capacity) }, n.vgFree >= 0 ? formatSize(n.vgFree) || "0" : "-"),
      el("td", { class: "disks", title: diskText(n.capacity) }, String(n.disks)),
      el("td", { class: "orphans", title: n.health && n.health.orphans ? n.health.orphans.map((o) => o.backingFile || o.uuid).join("\n") : "" },
        String(n.health && n.health.orphans ? n.health.orphans.length : 0)),
      el("td", { text: String(count) }),
      el("td", { text: phases || "-" }));
  })));
}

// vgText and diskText list a node's volume groups and candidate disks, one
// a line.
function vgText(c) {
  return c && c.vgs ? c.vgs.map((v) => `${v.name}: ${formatSize(v.free) || "0"} free of ${formatSize(v.size)}`).join("\n") : "";
}

function diskText(c) {
  return c && c.disks ? c.disks.map((d) => `${d.path}: ${formatSize(d.size)}${d.model ? " (" + d.model + ")" : ""}`).join("\n") : "";
}

// offerPlaces fills the create form's suggestions from the node's last
// report: its volume groups with their free space, and the devices that
// carry nothing.
function offerPlaces() {
  const n = state.nodes.find((x) => x.name === state.node);
  const c = n && n.capacity;
  const vgs = (c && c.vgs) || [], disks = (c && c.disks) || [];
  $("#vg-list").replaceChildren(...vgs.map((v) => el("option", { value: v.name, label: `${formatSize(v.free) || "0"} free of ${formatSize(v.size)}` })));
  $("#disk-list").replaceChildren(...disks.map((d) => el("option", { value: d.path, label: `${formatSize(d.size)}${d.model ? ", " + d.model : ""}` })));
  $("#vg-hint").textContent = vgs.length ? "On " + state.node + ": " + vgs.map((v) => `${v.name} (${formatSize(v.free) || "0"} free)`).join(", ") : c ? `${state.node} reports no volume group.` : "";
  $("#disk-hint").textContent = disks.length ? "Unused on " + state.node + ": " + disks.map((d) => `${d.path} (${formatSize(d.size)})`).join(", ") : c ? `${state.node} reports no unused device that carries nothing.` : "";
}

// pvText is the PV's phase and claim, "-" without one.
function pvText(pv) {
  if (!pv) return "-";
  if (pv.terminating) return "Terminating";
  return pv.claim ? pv.phase + " to " + pv.claim : pv.phase;
}

// kindText and specSize read the one kind a spec has.
function kindText(sp) {
  if (sp.sparseLoopDevice) return "sparse";
  if (sp.lvmLogicalVolume) return "lvm " + sp.lvmLogicalVolume.vgName;
  return "raw " + sp.rawBlockDevice.devicePath;
}

function specSize(sp) {
  const k = sp.sparseLoopDevice || sp.lvmLogicalVolume;
  return k ? String(k.size) : "";
}

function row(v) {
  const s = v.status, sp = v.spec;
  return {
    name: sp.name,
    node: sp.node,
    kind: kindText(sp),
    mode: sp.mode,
    fs: sp.fsType || "-",
    size: s.size || parseSize(specSize(sp)) || 0,
    sizeText: s.size ? formatSize(s.size) : (specSize(sp) || "-"),
    phase: s.phase,
    pv: pvText(s.persistentVolume),
    step: s.step ? s.step + (s.progress && s.progress.total > 0 ? " " + Math.min(100, Math.floor((s.progress.done * 100) / s.progress.total)) + " %" : "") : "",
    device: s.deviceName || "",
    path: s.persistentPath || "",
    age: -Date.parse(v.createdAt),
    v,
  };
}

function renderVolumes() {
  const all = state.node === ALL;
  $("#node-title").replaceChildren(all ? "All volumes" : "Node ", all ? "" : el("span", { id: "node-name", text: state.node }));
  $("#volumes").classList.toggle("one-node", !all);
  $("#all-filters").hidden = !all;
  $("#create-node").textContent = state.node;
  // A volume is created on a node: from that node's page.
  $("#show-create").hidden = all || !may("operator");
  if (all || !may("operator")) $("#create-form").hidden = true;
  $("#node-role").textContent = all && may("operator") ? "Open a node to create a volume on it." : roleNote();
  if (all) fillNodeFilter();
  else if (!$("#create-form").hidden) offerPlaces();
  const f = state.filter.toLowerCase();
  const mine = [...state.volumes.values()].filter((v) => all || v.spec.node === state.node);
  const rows = mine
    .filter((v) => !all || ((!state.nodeFilter || v.spec.node === state.nodeFilter) && (!state.phaseFilter || v.status.phase === state.phaseFilter)))
    .map(row)
    .filter((r) => !f || [r.name, all ? r.node : "", r.kind, r.mode, r.fs, r.phase, r.pv, r.step, r.device, r.path, r.v.status.message || ""]
      .some((x) => String(x).toLowerCase().includes(f)));
  setText("#count", rows.length === mine.length ? `${mine.length} volume${mine.length === 1 ? "" : "s"}` : `${rows.length} of ${mine.length} volumes shown`);
  $("#none-match").hidden = rows.length > 0 || mine.length === 0;
  const { key, dir } = state.sort;
  rows.sort((a, b) => (a[key] < b[key] ? -dir : a[key] > b[key] ? dir : 0));
  const tbody = $("#volumes tbody");
  // The rows are made anew: the keyboard's focus, if on one of them (its
  // link, its Delete button), goes back to the same one in its new row.
  keepFocus(tbody, () => {
  tbody.replaceChildren();
  for (const r of rows) {
    const s = r.v.status;
    const phase = el("td", { class: "phase-cell" }, el("span", { class: "phase phase-" + r.phase, text: r.phase }));
    if (s.message) phase.append(el("span", { class: "reason", text: (s.reason ? s.reason + ": " : "") + s.message }));
    const del = el("button", { type: "button", class: "delete", "data-volume": r.name, "data-role": "delete",
      disabled: !r.v.deletable, title: r.v.deletable ? "Delete " + r.name : r.v.deleteBlockedReason,
      "aria-label": "Delete volume " + r.name, "aria-describedby": r.v.deletable ? null : "why-" + r.name }, "Delete");
    del.hidden = !may("operator");
    del.addEventListener("click", () => confirmDelete(r.v));
    const actions = el("td", {}, del);
    if (!r.v.deletable && !del.hidden) actions.append(el("span", { class: "reason", id: "why-" + r.name, text: r.v.deleteBlockedReason }));
    tbody.append(el("tr", { "data-volume": r.name, "data-phase": r.phase },
      el("td", {}, el("a", { href: "#/volume/" + encodeURIComponent(r.name), text: r.name, "data-role": "name" })),
      el("td", { class: "col-node" }, el("a", { href: "#/node/" + encodeURIComponent(r.node), text: r.node, "data-role": "node" })), el("td", { text: r.kind }), el("td", { text: r.mode }), el("td", { text: r.fs }),
      el("td", { text: r.sizeText }), phase, el("td", { class: "pv", text: r.pv }), el("td", { class: "step", text: r.step }), el("td", { text: r.device }),
      el("td", {}, r.path ? el("code", { class: "path", text: r.path }) : ""), el("td", { text: age(r.v.createdAt), title: new Date(r.v.createdAt).toLocaleString() }),
      actions));
  }
  });
  $("#empty").hidden = mine.length > 0;
  $("#empty").textContent = all ? "No volumes yet: open a node to create one." : "No volumes on this node yet.";
  for (const b of document.querySelectorAll("#volumes th button")) {
    const th = b.parentElement;
    th.setAttribute("aria-sort", b.dataset.sort === key ? (dir > 0 ? "ascending" : "descending") : "none");
  }
}

// fillNodeFilter offers every node that has a volume or reported, keeping
// the choice made.
function fillNodeFilter() {
  const names = new Set(state.nodes.map((n) => n.name));
  for (const v of state.volumes.values()) names.add(v.spec.node);
  const want = [...names].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
  const sel = $("#node-filter");
  const have = [...sel.options].slice(1).map((o) => o.value);
  if (have.join("\n") !== want.join("\n")) {
    sel.replaceChildren(el("option", { value: "", text: "all nodes" }), ...want.map((n) => el("option", { value: n, text: n })));
  }
  sel.value = state.nodeFilter;
}

// ---- snapshots, audit and tokens pages ------------------------------------

// loadPage reads what the current page shows; a refusal (a viewer on the
// audit) shows on the page.
async function loadPage() {
  const page = state.page;
  const token = state.token;
  const seq = state.pageSeq = (state.pageSeq || 0) + 1;
  // An answer for an earlier request, another page or a session logged
  // out since is not what this page shows.
  const stale = () => state.page !== page || state.token !== token || state.pageSeq !== seq;
  if (page === "snapshots") {
    const r = await api("GET", "/api/v1/snapshots");
    if (r.status === 401) return logout("The token was refused.");
    if (stale()) return;
    state.snapshots = r.ok ? r.data.items : [];
    $("#m-snapshots").textContent = r.ok ? "" : refusal(r);
  } else if (page === "audit") {
    const q = new URLSearchParams({ since: $("#audit-since").value, limit: String(AUDIT_LIMIT) });
    if ($("#audit-user").value.trim()) q.set("user", $("#audit-user").value.trim());
    if ($("#audit-volume").value.trim()) q.set("volume", $("#audit-volume").value.trim());
    const r = await api("GET", "/api/v1/audit?" + q);
    if (r.status === 401) return logout("The token was refused.");
    if (stale()) return;
    state.audit = r.ok ? r.data.items : [];
    $("#m-audit").textContent = r.ok ? "" : refusal(r);
  } else if (page === "tokens") {
    const r = await api("GET", "/api/v1/tokens");
    if (r.status === 401) return logout("The token was refused.");
    if (stale()) return;
    state.tokens = r.ok ? r.data.items : [];
    $("#m-tokens").textContent = r.ok ? "" : refusal(r);
  }
  render();
}

const AUDIT_LIMIT = 500;

function renderPage() {
  if (state.page === "snapshots") renderFleetSnapshots();
  else if (state.page === "audit") renderAudit();
  else if (state.page === "tokens") renderTokens();
}

function renderFleetSnapshots() {
  const all = state.snapshots || [];
  const f = $("#snap-filter").value.trim().toLowerCase();
  const items = all.filter((x) => !f || [x.name, x.volume, x.node, x.phase, x.method, x.schedule || "", x.message || ""]
    .some((t) => String(t).toLowerCase().includes(f)));
  const count = items.length === all.length ? `${all.length} snapshot${all.length === 1 ? "" : "s"}` : `${items.length} of ${all.length} snapshots shown`;
  if ($("#snap-count").textContent !== count) $("#snap-count").textContent = count;
  $("#snapshots-empty").hidden = all.length > 0;
  const tbody = $("#snapshots tbody");
  keepFocus(tbody, () => tbody.replaceChildren(...items.map((x) => el("tr", { "data-snapshot": x.name },
    el("td", { text: x.name }),
    el("td", {}, el("a", { href: "#/volume/" + encodeURIComponent(x.volume), text: x.volume, "data-role": "volume" })),
    el("td", {}, el("a", { href: "#/node/" + encodeURIComponent(x.node), text: x.node, "data-role": "node" })),
    el("td", { class: "phase", title: x.message || "" }, x.phase, x.progress && x.progress.total > 0 ? " " : null, copyProgress(x.progress)),
    el("td", { text: (x.method || "") + (x.frozen ? " (frozen)" : "") }),
    el("td", { text: x.allocated ? formatSize(x.allocated) : "" }),
    el("td", { text: x.takenAt ? when(x.takenAt) : "" }),
    el("td", { text: x.schedule || "" }),
    el("td", {}, x.restore ? restoreText(x) : "", x.restore ? copyProgress(x.restore.progress) : null)))));
}

function renderAudit() {
  const items = [...(state.audit || [])].reverse();
  const cut = items.length >= AUDIT_LIMIT ? ` (the newest ${AUDIT_LIMIT}: narrow the search for older ones)` : "";
  const count = `${items.length} entr${items.length === 1 ? "y" : "ies"}, newest first${cut}`;
  if ($("#audit-count").textContent !== count) $("#audit-count").textContent = count;
  $("#audit tbody").replaceChildren(...items.map((e) => el("tr", { class: "history-" + e.decision },
    el("td", { text: when(e.time) }),
    el("td", { text: e.user + (e.role ? " (" + e.role + ")" : "") }),
    el("td", { text: e.source || "" }),
    el("td", {}, el("code", { text: e.method + " " + e.route })),
    el("td", {}, e.volume ? el("a", { href: "#/volume/" + encodeURIComponent(e.volume), text: e.volume }) : ""),
    el("td", { text: e.node || "" }),
    el("td", { class: "decision", text: e.decision + (e.status ? " (" + e.status + ")" : "") }),
    el("td", { text: [e.reason, e.jobId ? `job ${e.jobId}: ${e.outcome || ""}` : ""].filter(Boolean).join("; ") }))));
}

function renderTokens() {
  const items = state.tokens || [];
  // A Kubernetes identity uses its own tokens: the API refuses it this.
  $("#token-form").hidden = !may("admin") || !!(state.who && state.who.kind === "kubernetes");
  const tbody = $("#tokens tbody");
  keepFocus(tbody, () => tbody.replaceChildren(...items.map((t) => {
    const revoke = el("button", { type: "button", class: "danger revoke", text: "Revoke", "data-role": "revoke", "aria-label": "Revoke token " + t.name });
    revoke.hidden = !may("admin");
    revoke.addEventListener("click", () => confirmThen(
      `Revoke ${t.kind} token ${t.name}${t.user ? " of " + t.user : ""} (${t.role})? Whatever uses it is refused from now on, on every replica.`,
      "Revoke", async () => {
        const r = await api("DELETE", "/api/v1/tokens/" + encodeURIComponent(t.name));
        $("#m-tokens").textContent = r.ok ? "" : refusal(r);
        loadPage();
      }));
    return el("tr", { "data-token": t.name },
      el("td", { text: t.name }), el("td", { text: t.kind }), el("td", { text: t.user || "" }), el("td", { text: t.role }),
      el("td", { text: when(t.created) + (t.createdBy ? " by " + t.createdBy : "") }),
      el("td", { text: t.expires ? new Date(t.expires).toLocaleString() + " (in " + until(t.expires) + ")" : "never" }), el("td", {}, revoke));
  })));
}

async function submitToken(e) {
  e.preventDefault();
  const name = $("#token-name").value.trim();
  if (!name) {
    $("#m-token").textContent = "Name it after what will use it, e.g. prometheus.";
    return;
  }
  const body = { name, role: $("#token-role").value };
  const expires = $("#token-expires").value.trim();
  if (expires) body.expires = expires;
  const token = state.token;
  const r = await api("POST", "/api/v1/tokens", body);
  // Logged out, or gone elsewhere, meanwhile: the secret is shown to
  // nobody (the token is listed, and can be revoked).
  if (state.token !== token || state.page !== "tokens") return;
  $("#m-token").textContent = r.ok ? "" : refusal(r);
  if (r.ok) {
    $("#token-name").value = "";
    $("#token-expires").value = "";
    // The secret is shown here once, never stored by the page.
    $("#token-secret-name").textContent = r.data.name;
    $("#token-secret-value").value = r.data.token;
    $("#token-secret").hidden = false;
    // On the secret, selected: copied with one keystroke.
    $("#token-secret-value").focus();
    $("#token-secret-value").select();
  }
  loadPage();
}

function hideSecret() {
  const had = !$("#token-secret").hidden && $("#token-secret").contains(document.activeElement);
  $("#token-secret-value").value = "";
  $("#token-secret").hidden = true;
  if (had) $("#token-name").focus();
}

// ---- volume detail ----------------------------------------------------------

function dl(target, rows) {
  target.replaceChildren();
  for (const [k, v] of rows) {
    if (v === undefined || v === null || v === "") continue;
    target.append(el("dt", { text: k }), el("dd", { text: String(v) }));
  }
}

function renderDetail() {
  const name = state.volume;
  const v = state.volumes.get(name);
  $("#vol-name").textContent = name;
  const node = v ? v.spec.node : "";
  $("#back-to-node").setAttribute("href", node ? "#/node/" + encodeURIComponent(node) : "#/");
  $("#back-to-node").textContent = node ? "\u2190 node " + node : "\u2190 nodes";
  if (!v) {
    $("#vol-phase").textContent = "";
    setText("#vol-reason", state.volumes.size ? "This volume does not exist (any more)." : "");
    for (const b of ["#vol-delete", "#vol-wipe", "#vol-forget", "#grow-form"]) $(b).hidden = true;
    $("#vol-restore").textContent = "";
    return;
  }
  const s = v.status, sp = v.spec;
  $("#vol-phase").textContent = s.phase;
  $("#vol-phase").className = "phase phase-" + s.phase;
  setText("#vol-reason", s.message ? (s.reason ? s.reason + ": " : "") + s.message : "");
  const op = may("operator"), admin = may("admin");
  // The control plane refuses these while a restore runs (409): say so
  // before anyone asks.
  const busy = restoringOf(v);
  const busyWhy = busy ? `${name} is being restored from snapshot ${busy.name}: wait until that has finished.` : "";
  $("#vol-role").textContent = roleNote();
  const del = $("#vol-delete");
  del.hidden = !op;
  del.disabled = !v.deletable || !!busy;
  del.title = busy ? busyWhy : v.deletable ? "Delete " + name : v.deleteBlockedReason;
  // Wiping and forgetting are an admin's: an operator sees them disabled,
  // saying so, rather than learning it from a refusal.
  $("#vol-wipe").hidden = !op || (!sp.rawBlockDevice && !sp.lvmLogicalVolume);
  $("#vol-wipe").disabled = !v.deletable || !admin || !!busy;
  $("#vol-wipe").title = admin ? busyWhy : "Wiping needs role admin.";
  $("#vol-forget").hidden = !op || s.phase !== "Failed";
  $("#vol-forget").disabled = !admin;
  $("#vol-forget").title = admin ? "" : "Forgetting needs role admin.";
  // Sparse and LVM volumes grow to a size, raw ones to their grown device;
  // only once Available (the node's answer otherwise names why), or again
  // after a growth that failed.
  $("#grow-form").hidden = !op;
  $("#grow-size").hidden = $("label[for=grow-size]").hidden = !!sp.rawBlockDevice;
  $("#vol-grow").textContent = sp.rawBlockDevice ? "Grow to its device" : "Grow";
  $("#vol-grow").disabled = !(s.phase === "Available" || growthFailed(v)) || !!v.deleting || !!busy;
  $("#vol-grow").title = busyWhy;
  // Why a button is disabled, on the page beside them (a disabled
  // button's tooltip reaches neither the keyboard nor a touch screen),
  // and tied to each such button.
  const whys = [];
  if (op) {
    if (busy) whys.push(busyWhy);
    else if (!v.deletable) whys.push(v.deleteBlockedReason);
    else if ($("#vol-grow").disabled && !v.deleting) whys.push(`${name} grows once it is Available.`);
    if (!admin && (!$("#vol-wipe").hidden || !$("#vol-forget").hidden)) whys.push("Wiping and forgetting need role admin.");
  }
  setText("#vol-blocked", whys.join(" "));
  for (const b of ["#vol-delete", "#vol-wipe", "#vol-forget", "#vol-grow", "#take-snapshot"]) {
    if ($(b).disabled && whys.length) $(b).setAttribute("aria-describedby", "vol-blocked");
    else $(b).removeAttribute("aria-describedby");
  }
  dl($("#vol-spec"), [["Node", sp.node], ["UUID", sp.uuid],
    ["Kind", sp.sparseLoopDevice ? "sparse file" : sp.lvmLogicalVolume ? "logical volume " + sp.lvmLogicalVolume.vgName + "/" + sp.name : "raw device " + sp.rawBlockDevice.devicePath],
    ["Size", specSize(sp)], ["Mode", sp.mode], ["Filesystem", sp.fsType],
    ["mkfs options", (sp.mkfsOptions || []).join(" ")], ["Encryption", sp.encryption ? "LUKS2, " + sp.encryption.provider : ""],
    ["Created", when(v.createdAt)], ["Origin", v.origin],
    ["Claim", v.claim ? v.claim.namespace + "/" + v.claim.name + " (" + v.claim.storageClass + ", " + v.claim.reclaimPolicy + ")" : ""]]);
  dl($("#vol-status"), [["Phase", s.phase], ["Reason", s.reason], ["Step", s.step], ["Device", s.devicePath],
    ["Persistent path", s.persistentPath], ["Device size", s.size ? formatSize(s.size) : ""], ["In use", s.inUse ? "yes" : ""],
    ["Job", s.jobId], ["Updated", when(s.updatedAt)]]);
  // A long step (a clone's copy, a wipe) tells its bytes as it goes.
  const p = s.progress;
  $("#vol-progress").hidden = !(s.step && p && p.total > 0);
  if (s.step && p && p.total > 0) {
    const pct = Math.min(100, Math.floor((p.done * 100) / p.total));
    $("#vol-progress-bar").value = pct;
    $("#vol-progress-bar").textContent = pct + " %";
    $("#vol-progress-label").textContent = s.step + ": " + (formatSize(p.done) || "0") + " of " + formatSize(p.total) + " (" + pct + " %)";
  }
  const u = state.detail.usage;
  dl($("#vol-usage"), u ? [["State", u.state], ["Allocated", u.allocated ? formatSize(u.allocated) : ""],
    ["Filesystem used", u.fsUsed ? formatSize(u.fsUsed) : ""], ["Filesystem free", u.fsFree ? formatSize(u.fsFree) : ""],
    ["Mounted at", (u.mountpoints || []).join(", ")], ["Node says", u.error], ["Reported", when(u.reportedAt)]]
    : [["State", "not reported yet"]]);
  $("#vol-pv-card").hidden = !s.persistentVolume;
  if (s.persistentVolume) {
    const pv = s.persistentVolume;
    dl($("#vol-pv"), [["Name", pv.name], ["Phase", pv.phase], ["Claim", pv.claim], ["Terminating", pv.terminating ? "yes" : ""]]);
  }
  renderChart(v);
  renderJobs();
  renderHistory();
  renderSnapshots(v);
  renderSchedules(v);
}

// restoringNow: a restore from snapshot x runs.
function restoringNow(x) {
  return !!x.restore && x.restore.phase === "Restoring";
}

// restoringOf is the snapshot volume v is being restored from (null: none).
function restoringOf(v) {
  return (state.detail.snapshots || []).find((x) => x.volumeUUID === v.spec.uuid && restoringNow(x)) || null;
}

// heldFor says who holds v, as the control plane sees it: then only an
// admin restores it ("": nobody).
function heldFor(v) {
  const pv = v.status.persistentVolume;
  if (v.status.inUse) return `it is in use on ${v.spec.node}`;
  if (pv && (pv.phase === "Bound" || pv.phase === "Pending")) return `its PersistentVolume ${pv.name} is ${pv.phase} (claim ${pv.claim})`;
  return "";
}

// restoreBlocked says why v is not restored from snapshot x now ("": it
// may be): what the control plane would refuse, said on the button.
function restoreBlocked(v, x) {
  const busy = restoringOf(v);
  if (x.volumeUUID !== v.spec.uuid) return `${x.name} is a snapshot of an earlier volume named ${v.spec.name}, not of this one.`;
  if (!v.spec.sparseLoopDevice && !v.spec.lvmLogicalVolume) return "Only sparse and LVM volumes are restored in place (a raw volume: clone the snapshot instead).";
  if (x.for) return `${x.name} was taken for the clone ${x.for} alone: restore from a snapshot of your own.`;
  if (busy) return `${v.spec.name} is being restored from snapshot ${busy.name}.`;
  if (v.deleting) return `${v.spec.name} is being deleted.`;
  if (v.status.phase !== "Available") return `${v.spec.name} is ${v.status.phase}: restore it once it is Available.`;
  const held = heldFor(v);
  if (held && !may("admin")) return `Restoring ${v.spec.name} while ${held} needs role admin.`;
  return "";
}

// copyProgress is the copy a snapshot's job (or its restore's) is making,
// as its node last reported it: a bar and its words, or nothing.
function copyProgress(p) {
  if (!p || !(p.total > 0)) return null;
  const pct = Math.max(0, Math.min(100, Math.floor((p.done * 100) / p.total)));
  const words = `${p.step} ${formatSize(p.done) || "0"} of ${formatSize(p.total)} (${pct} %)`;
  return el("span", { class: "copy-progress" },
    el("progress", { max: "100", value: String(pct), "aria-label": words, text: pct + " %" }), el("span", { "aria-hidden": "true", text: " " + words }));
}

// restoreText is how the last restore from snapshot x went.
function restoreText(x) {
  const r = x.restore;
  const by = r.requestedBy ? " by " + r.requestedBy : "";
  if (r.phase === "Restoring") return `Restoring ${x.volume} from this snapshot (asked${by} ${age(r.requestedAt)} ago)…` + (r.message ? " " + r.message : "");
  const when = r.finishedAt ? " " + age(r.finishedAt) + " ago" : "";
  if (r.phase === "Restored") {
    return `Restored${when}${by}` + (r.took ? ` in ${r.took}` : "") + "." + (r.warnings && r.warnings.length ? " " + r.warnings.join(" ") : "");
  }
  return `Restore failed${when}${by}: ${r.message || "the node gave no reason"}`;
}

// scheduleText is one schedule of the volume as a sentence: what it does,
// how its last run went, when the next comes.
function scheduleText(x) {
  const who = x.source === "api" ? "Set through the API" + (x.createdBy ? " by " + x.createdBy : "") : `Salt schedule ${x.schedule} in ${x.node}'s pillar`;
  const what = [x.every ? "every " + x.every : "", x.keep ? "keeps " + x.keep : "", x.maxAge ? "prunes past " + x.maxAge : ""].filter(Boolean).join(", ");
  let s = `${who}${what ? ": " + what : ""}.`;
  s += x.lastSuccess ? ` Last snapshot ${x.lastSnapshot || ""} ${age(x.lastSuccess)} ago.` : " No snapshot taken yet.";
  if (x.taking) s += ` Taking ${x.taking} now.`;
  else if (x.nextAt) s += ` Next at ${new Date(x.nextAt).toLocaleString()} (in ${until(x.nextAt)}).`;
  if (x.failing) s += ` Failing${x.failures ? " (" + x.failures + " in a row)" : ""}: ${x.lastError || "the node gave no reason"}`;
  if (x.overdue) s += " Overdue: no snapshot within twice its interval.";
  return s;
}

// renderSchedules lists the schedules that take snapshots of the volume
// (the API's and the nodes' Salt ones); an operator sets or removes the
// API's one here, a Salt one only in pillar.
function renderSchedules(v) {
  const items = state.detail.schedules || [];
  const ul = $("#vol-schedules");
  ul.replaceChildren(...items.map((x) => el("li", { class: "schedule" + (x.failing || x.overdue ? " silent" : ""), "data-source": x.source, text: scheduleText(x) })));
  $("#vol-schedules-empty").hidden = items.length > 0;
  const mine = items.find((x) => x.source === "api");
  $("#schedule-form").hidden = !may("operator") || !!v.deleting;
  $("#remove-schedule").hidden = !mine;
  $("#set-schedule").textContent = mine ? "Change schedule" : "Set schedule";
  // The form starts from the schedule there is, but never overwrites what
  // someone is typing.
  const form = $("#schedule-form");
  if (mine && state.scheduleShown !== mine.createdAt + mine.every + mine.keep + mine.maxAge && !form.contains(document.activeElement)) {
    state.scheduleShown = mine.createdAt + mine.every + mine.keep + mine.maxAge;
    $("#schedule-every").value = mine.every || "";
    $("#schedule-keep").value = mine.keep ? String(mine.keep) : "";
    $("#schedule-max-age").value = mine.maxAge || "";
  }
}

async function submitSchedule(e) {
  e.preventDefault();
  const v = state.volumes.get(state.volume);
  if (!v) return;
  const every = $("#schedule-every").value.trim();
  const keepText = $("#schedule-keep").value.trim();
  const maxAge = $("#schedule-max-age").value.trim();
  if (!every) {
    $("#m-schedule").textContent = "Say how often, e.g. 1h or 1d.";
    return;
  }
  if (!/^[0-9]+$/.test(keepText)) {
    $("#m-schedule").textContent = "Say how many of its snapshots the schedule keeps: a whole number, e.g. 24.";
    return;
  }
  const body = { every, keep: Number(keepText) };
  if (maxAge) body.maxAge = maxAge;
  const r = await api("PUT", "/api/v1/volumes/" + encodeURIComponent(v.spec.name) + "/snapshot-schedule", body);
  $("#m-schedule").textContent = r.ok ? "" : refusal(r);
  if (r.ok) state.scheduleShown = null;
  refreshDetail();
}

async function removeSchedule() {
  const v = state.volumes.get(state.volume);
  if (!v) return;
  const r = await api("DELETE", "/api/v1/volumes/" + encodeURIComponent(v.spec.name) + "/snapshot-schedule");
  $("#m-schedule").textContent = r.ok ? "" : refusal(r);
  if (r.ok) {
    state.scheduleShown = null;
    for (const id of ["#schedule-every", "#schedule-keep", "#schedule-max-age"]) $(id).value = "";
  }
  refreshDetail();
}

function renderSnapshots(v) {
  const lv = v.spec.lvmLogicalVolume;
  const op = may("operator");
  // A raw volume's snapshot is the node's call (only an operator's LV has
  // one): the form is there, its refusal shows in the table.
  $("#snapshot-size").hidden = $("#snapshot-size-label").hidden = $("#snapshot-size-hint").hidden = !!v.spec.sparseLoopDevice || !!(lv && lv.thinPool);
  $("#snapshot-form").hidden = !op;
  const tbody = $("#vol-snapshots tbody");
  const items = state.detail.snapshots || [];
  $("#vol-snapshots-empty").hidden = items.length > 0;
  const from = state.cloneFrom;
  if (!from || !items.some((x) => x.name === from.name && x.phase === "Ready")) {
    state.cloneFrom = null;
    $("#clone-form").hidden = true;
  }
  const busy = restoringOf(v);
  $("#take-snapshot").disabled = !!busy;
  if (busy) $("#take-snapshot").setAttribute("aria-describedby", "vol-blocked");
  else $("#take-snapshot").removeAttribute("aria-describedby");
  $("#take-snapshot").title = busy ? `${v.spec.name} is being restored from snapshot ${busy.name}: take it once that has finished.` : "";
  // The volume's last restore, from whichever of its snapshots: its phase
  // stays Available throughout, so this is where the page says it.
  const last = items.filter((x) => x.restore && x.volumeUUID === v.spec.uuid)
    .sort((a, b) => Date.parse(a.restore.requestedAt) - Date.parse(b.restore.requestedAt)).pop();
  const vr = $("#vol-restore");
  const when = last && last.restore.finishedAt ? new Date(last.restore.finishedAt).toLocaleString() : "";
  const text = last ? (restoringNow(last) ? `Being restored from snapshot ${last.name}: everything written since it was taken is being replaced.`
    : last.restore.phase === "Restored" ? `Last restored from snapshot ${last.name} at ${when}.`
      : /restore_unfinished/.test(last.restore.message || "")
        ? `Restoring from snapshot ${last.name} did not finish (${when}): the volume already holds the snapshot's data, it was NOT left as it was; ask the restore again to finish it: ${last.restore.message}`
        : `Restoring from snapshot ${last.name} failed at ${when}; the volume is as it was: ${last.restore.message || "the node gave no reason"}`) : "";
  // Set only when it changes: it is a live region, and the page is drawn
  // again every second while a restore runs.
  if (vr.textContent !== text) vr.textContent = text;
  vr.dataset.restore = last ? last.restore.phase : "";
  vr.className = last && last.restore.phase === "Failed" ? "error" : "";
  keepFocus(tbody, () => {
  tbody.replaceChildren();
  for (const x of items) {
    const clone = el("button", { type: "button", class: "clone", text: "Clone", "data-role": "clone", "aria-label": "Clone snapshot " + x.name });
    clone.hidden = x.phase !== "Ready" || !op;
    clone.addEventListener("click", () => {
      state.cloneFrom = x;
      $("#clone-of").textContent = x.name;
      $("#m-clone").textContent = "";
      $("#clone-form").hidden = false;
      $("#clone-name").focus();
    });
    const why = restoreBlocked(v, x);
    const restore = el("button", { type: "button", class: "restore", text: "Restore", "data-role": "restore",
      "aria-label": `Restore ${v.spec.name} to snapshot ${x.name}`,
      disabled: !!why, title: why || `Put ${v.spec.name} back to ${x.name}, losing what was written since`,
      "aria-describedby": why ? "why-restore-" + x.name : null });
    restore.hidden = x.phase !== "Ready" || !op;
    // Why it cannot be restored, said on the page: a disabled button's
    // title reaches neither the keyboard nor a touch screen.
    const whyText = why && !restore.hidden ? el("span", { class: "reason", id: "why-restore-" + x.name, text: why }) : null;
    restore.addEventListener("click", () => confirmRestore(v, x));
    const del = el("button", { type: "button", class: "danger", text: "Delete", "data-role": "delete", "aria-label": "Delete snapshot " + x.name,
      disabled: !!busy, title: busy ? `${v.spec.name} is being restored from snapshot ${busy.name}.` : null });
    del.hidden = x.phase === "Deleting" || !op;
    del.addEventListener("click", () => confirmThen(
      `Delete snapshot ${x.name} of volume ${v.spec.name} on node ${v.spec.node}?` +
        (x.takenAt ? ` What ${v.spec.name} held at ${new Date(x.takenAt).toLocaleString()} is gone with it;` : "") +
        " the volume and clones made from the snapshot stay.",
      "Delete snapshot", async () => {
        const r = await api("DELETE", "/api/v1/snapshots/" + encodeURIComponent(x.name));
        $("#m-snapshot").textContent = r.ok ? "" : refusal(r);
        refreshDetail();
      }));
    const outcome = x.restore ? el("span", { class: "reason restore-status restore-" + x.restore.phase, "data-restore": x.restore.phase,
      text: restoreText(x) }, x.restore.progress && x.restore.progress.total > 0 ? " " : null, copyProgress(x.restore.progress)) : null;
    tbody.append(el("tr", { "data-snapshot": x.name },
      el("td", { text: x.name }), el("td", { class: "phase", title: x.message || "" }, x.phase, x.progress && x.progress.total > 0 ? " " : null, copyProgress(x.progress)),
      el("td", { text: (x.method || "") + (x.frozen ? " (frozen)" : "") }), el("td", { text: x.allocated ? formatSize(x.allocated) : "" }),
      el("td", { text: x.takenAt ? age(x.takenAt) + " ago" : (x.message || ""), title: x.takenAt ? new Date(x.takenAt).toLocaleString() : "" }), el("td", {}, clone, " ", restore, " ", del, whyText, outcome)));
  }
  });
}

// confirmRestore asks before a restore, naming what is lost, and has the
// volume's name typed: a restore cannot be undone, and a click out of
// habit on a dialog like every other would do it.
function confirmRestore(v, x) {
  const dlg = $("#restore-dialog");
  state.restoreOf = { volume: v.spec.name, snapshot: x.name };
  const taken = x.takenAt || x.createdAt;
  $("#restore-volume").textContent = v.spec.name;
  $("#restore-snapshot").textContent = x.name;
  // A thick LVM snapshot merges into its volume and is gone; a thin one
  // and a sparse volume's stay.
  const stays = x.method === "lvm-thick"
    ? `The snapshot is used up: LVM merges it into the volume and it is gone afterwards (to keep a copy, clone it first: Clone, or salt-volumes create NEW --from snapshot/${x.name}).`
    : "The snapshot stays.";
  $("#restore-text").textContent = `Everything written to ${v.spec.name} since snapshot ${x.name} was taken at ${new Date(taken).toLocaleString()} ` +
    `(${age(taken)} ago) is lost: node ${v.spec.node} puts the volume back to the snapshot in place, same path and device. ` +
    stays + " Nothing may use the volume meanwhile (unmount it, stop its pods): the node refuses a volume in use and changes nothing.";
  $("#restore-want").textContent = v.spec.name;
  $("#restore-confirm").value = "";
  $("#restore-ok").disabled = true;
  $("#restore-wrong").textContent = "";
  dlg.returnValue = "";
  rememberOpener();
  dlg.showModal();
  $("#restore-confirm").focus();
}

async function submitRestore(of) {
  const r = await api("POST", "/api/v1/snapshots/" + encodeURIComponent(of.snapshot) + "/restore");
  $("#m-snapshot").textContent = r.ok ? "" : refusal(r);
  if (r.ok && of.volume === state.volume && state.detail.snapshots) {
    // Shown at once: the next look at the snapshots is 300 ms away.
    state.detail.snapshots = state.detail.snapshots.map((x) => (x.name === r.data.name ? r.data : x));
    render();
  }
  refreshDetail();
}

// A clone is a new volume on the snapshot's node, of its volume's mode and
// filesystem and the snapshot's size: a sparse file, or an LV in the
// snapshot's VG.
async function submitClone(e) {
  e.preventDefault();
  const v = state.volumes.get(state.volume);
  const x = state.cloneFrom;
  const name = $("#clone-name").value.trim();
  if (!v || !x) return;
  if (!/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(name)) {
    $("#m-clone").textContent = "Name the new volume with lower-case letters, digits and '-', e.g. " + v.spec.name + "-copy.";
    return;
  }
  const body = { name, node: x.node, mode: v.spec.mode, source: { volumeUUID: x.volumeUUID, snapshot: x.name } };
  if (v.spec.fsType) body.fsType = v.spec.fsType;
  if (x.lv) body.lvmLogicalVolume = { vgName: x.lv.split("/")[0], size: String(x.size) };
  else body.sparseLoopDevice = { size: String(x.size) };
  const r = await api("POST", "/api/v1/volumes", body);
  if (!r.ok) {
    $("#m-clone").textContent = refusal(r);
    return;
  }
  $("#clone-name").value = "";
  state.cloneFrom = null;
  $("#clone-form").hidden = true;
  location.hash = "#/volume/" + encodeURIComponent(name);
}

async function submitSnapshot(e) {
  e.preventDefault();
  const v = state.volumes.get(state.volume);
  const name = $("#snapshot-name").value.trim();
  if (!v) return;
  if (!/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(name)) {
    $("#m-snapshot").textContent = "Name it with lower-case letters, digits and '-', e.g. before-upgrade.";
    return;
  }
  const body = { name };
  const size = $("#snapshot-size").hidden ? "" : $("#snapshot-size").value.trim();
  if (size) body.size = size;
  const r = await api("POST", "/api/v1/volumes/" + encodeURIComponent(v.spec.name) + "/snapshots", body);
  if (r.ok) {
    $("#snapshot-name").value = "";
    $("#snapshot-size").value = "";
    $("#m-snapshot").textContent = "";
  } else {
    $("#m-snapshot").textContent = refusal(r);
  }
  refreshDetail();
}

function renderChart(v) {
  const samples = state.detail.samples || [];
  const box = $("#vol-chart");
  $("#vol-chart-empty").hidden = samples.length > 0;
  if (!samples.length) { box.replaceChildren(); return; }
  const W = 640, H = 220, L = 64, R = 12, T = 12, B = 30;
  // The last 24 hours, or less when the volume is younger: a new volume's
  // first minutes would be a sliver at the right edge.
  const now = Date.now();
  const first = Date.parse(samples[0].at);
  const span = Math.min(24 * 3600e3, Math.max(10 * 60e3, (now - first) * 1.1));
  const from = now - span;
  const ago = (ms) => ms >= 3600e3 ? "-" + +(ms / 3600e3).toFixed(1) + "h" : "-" + Math.round(ms / 60e3) + "m";
  const size = v.status.size || parseSize(specSize(v.spec)) || 0;
  const top = Math.max(size, ...samples.map((p) => Math.max(p.allocated, p.fsUsed || 0)), 1);
  const x = (t) => L + ((t - from) / (now - from)) * (W - L - R);
  const y = (b) => T + (1 - b / top) * (H - T - B);
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", class: "usage-chart",
    "aria-label": `Usage of ${v.spec.name} over the last ${ago(span).slice(1)}: ${samples.length} reports, allocated now ${formatSize(samples[samples.length - 1].allocated) || "0"} of ${formatSize(top)}` });
  for (const f of [0, 0.25, 0.5, 0.75, 1]) {
    g.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(top * f), y2: y(top * f) }),
      svg("text", { x: L - 6, y: y(top * f) + 4, "text-anchor": "end" }, formatSize(Math.round(top * f)) || "0"));
  }
  for (const f of [1, 0.75, 0.5, 0.25, 0]) {
    g.append(svg("text", { x: x(now - f * span), y: H - 10, "text-anchor": "middle" }, f ? ago(f * span) : "now"));
  }
  g.append(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }), svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  // Step lines: a value holds until the next report.
  const path = (key) => {
    let d = "";
    samples.forEach((p, i) => {
      const px = x(Math.max(from, Date.parse(p.at))), py = y(p[key] || 0);
      d += i === 0 ? `M${px},${py}` : `H${px}V${py}`;
    });
    return d + `H${x(now)}`;
  };
  g.append(svg("path", { class: "line-allocated", d: path("allocated") }));
  if (samples.some((p) => p.fsUsed)) g.append(svg("path", { class: "line-fsused", d: path("fsUsed") }));
  g.append(svg("text", { x: L + 8, y: T + 12 }, "allocated (solid)" + (samples.some((p) => p.fsUsed) ? ", filesystem used (dashed)" : "")));
  box.replaceChildren(g);
}

// What people did to the volume, newest first: "created by alice 3h ago".
const ACTS = { POST: "created", DELETE: "deleted" };
function renderHistory() {
  const ul = $("#vol-history");
  ul.replaceChildren();
  const items = [...(state.detail.history || [])].reverse();
  $("#vol-history-empty").hidden = items.length > 0;
  for (const e of items) {
    const snap = e.route.match(/\/snapshots(?:\/([^/?]+))?/);
    const sched = /\/snapshot-schedule(\?|$)/.test(e.route);
    let act = /\/resize$/.test(e.route) ? "growth"
      : sched ? (e.method === "DELETE" ? "snapshot schedule removal" : "snapshot schedule")
      : snap && /\/restore$/.test(e.route) ? "restore from snapshot " + decodeURIComponent(snap[1] || "")
      : snap ? (e.method === "POST" ? "snapshot" : "snapshot " + decodeURIComponent(snap[1] || "") + " deletion")
        : (ACTS[e.method] || e.method);
    if (/[?&]wipe=true/.test(e.route)) act += " and wiped";
    const text = e.decision === "allowed"
      ? `${act} by ${e.user} ${age(e.time)} ago` + (e.jobId ? ` (job ${e.jobId}: ${e.outcome})` : "")
      : `${act === "created" ? "create" : act === "deleted" ? "delete" : act} ${e.decision} for ${e.user} ${age(e.time)} ago` + (e.reason ? ": " + e.reason : "");
    ul.append(el("li", { class: "history-" + e.decision, title: new Date(e.time).toLocaleString() + " from " + e.source, text }));
  }
}

function renderJobs() {
  const tbody = $("#vol-jobs tbody");
  tbody.replaceChildren();
  const jobs = [...(state.detail.jobs || [])].reverse();
  $("#vol-jobs-empty").hidden = jobs.length > 0;
  for (const j of jobs) {
    const t0 = Date.parse(j.started);
    const secs = (iso) => ((Date.parse(iso) - t0) / 1000).toFixed(2);
    // A job just started has no steps yet (null in its JSON).
    const steps = (j.steps || []).map((st) => `${st.name} +${secs(st.at)}`).join(", ");
    const done = j.finished && !j.finished.startsWith("0001") ? ` (+${secs(j.finished)})` : "";
    tbody.append(el("tr", { "data-jid": j.jid },
      el("td", {}, el("code", { text: j.jid })), el("td", { text: j.sls }), el("td", { text: new Date(t0).toLocaleString() }),
      el("td", { class: "job-result", text: j.result + done, title: j.message || "" }), el("td", { class: "job-steps", text: steps || "-" })));
  }
}

// ---- delete ---------------------------------------------------------------

// growthFailed: the volume's last growth failed on its node.
function growthFailed(v) {
  return v.status.phase === "Failed" && v.status.reason === "ResizeFailed";
}

// submitGrow asks for the volume to grow; the watch stream shows it go
// Pending and back to Available with its new size.
async function submitGrow(e) {
  e.preventDefault();
  const v = state.volumes.get(state.volume);
  if (v && v.spec.rawBlockDevice) {
    // A raw volume follows its device, which the operator grew.
    const r = await api("POST", "/api/v1/volumes/" + encodeURIComponent(v.spec.name) + "/resize", { toDevice: true });
    if (r.ok) {
      state.volumes.set(v.spec.name, r.data);
      renderDetail();
    } else {
      $("#m-grow").textContent = refusal(r);
    }
    return;
  }
  const size = $("#grow-size").value.trim();
  const n = parseSize(size);
  const cur = v ? parseSize(specSize(v.spec)) : NaN;
  $("#m-grow").textContent = "";
  if (!v) return;
  if (!size || isNaN(n)) {
    $("#m-grow").textContent = "Give the new size, e.g. 20Gi.";
    return;
  }
  // After a failed growth the size it had before is allowed again: the
  // control plane knows it, and says so when refusing.
  if (!isNaN(cur) && n < cur && !growthFailed(v)) {
    $("#m-grow").textContent = `Volumes only grow: ${size} is smaller than ${specSize(v.spec)}.`;
    return;
  }
  const r = await api("POST", "/api/v1/volumes/" + encodeURIComponent(v.spec.name) + "/resize", { size });
  if (r.ok) {
    state.volumes.set(v.spec.name, r.data);
    $("#grow-size").value = "";
    renderDetail();
  } else {
    $("#m-grow").textContent = refusal(r);
  }
}

// confirmAction asks before a destructive action: delete, delete and wipe
// (raw devices), or forget (Failed volumes whose node is gone).
function confirmAction(v, how) {
  const dlg = $("#confirm");
  const texts = {
    delete: `Delete volume ${v.spec.name} on node ${v.spec.node}? ` +
      (v.spec.sparseLoopDevice ? "Its sparse file and all data in it are removed." :
        v.spec.lvmLogicalVolume ? "Its logical volume and data stay unless wiped." : "The device is released; its data stays unless wiped."),
    wipe: v.spec.lvmLogicalVolume ?
      `Delete volume ${v.spec.name}, zero its logical volume ${v.spec.lvmLogicalVolume.vgName}/${v.spec.name} and remove it (node ${v.spec.node})? Its data is gone.` :
      `Delete volume ${v.spec.name} and zero all of ${v.spec.rawBlockDevice ? v.spec.rawBlockDevice.devicePath : "its device"} (node ${v.spec.node}), checking it reads back zeros? Its data is gone.`,
    forget: `Forget volume ${v.spec.name}? Nothing runs on node ${v.spec.node}: whatever is there stays, and a later salt_volumes run there adopts it again.`,
  };
  $("#confirm-text").textContent = texts[how];
  $("#confirm-ok").textContent = { delete: "Delete", wipe: "Delete and wipe", forget: "Forget" }[how];
  dlg.returnValue = "";
  dlg.onclose = async () => {
    if (dlg.open) return;
    returnFocus();
    if (dlg.returnValue !== "ok") return;
    const q = how === "wipe" ? "?wipe=true" : how === "forget" ? "?forget=true" : "";
    const r = await api("DELETE", "/api/v1/volumes/" + encodeURIComponent(v.spec.name) + q);
    if (!r.ok) alertError(r);
  };
  rememberOpener();
  dlg.showModal();
  $("#confirm-cancel").focus();
}

function confirmDelete(v) { confirmAction(v, "delete"); }

// confirmThen asks in the confirmation dialog and runs act on OK.
function confirmThen(text, ok, act) {
  const dlg = $("#confirm");
  $("#confirm-text").textContent = text;
  $("#confirm-ok").textContent = ok;
  dlg.returnValue = "";
  dlg.onclose = async () => {
    if (dlg.open) return;
    returnFocus();
    if (dlg.returnValue === "ok") await act();
  };
  rememberOpener();
  dlg.showModal();
  $("#confirm-cancel").focus();
}

function alertError(r) {
  const msg = r.data && r.data.error ? r.data.error.message : "HTTP " + r.status;
  // On a list the create form is mostly hidden: the list's own line.
  $(state.volume ? "#vol-error" : $("#create-form").hidden ? "#list-error" : "#create-error").textContent = msg;
}

// ---- create ---------------------------------------------------------------

const FIELD_MSG = { name: "#m-name", "sparseLoopDevice.size": "#m-size", "sparseLoopDevice": "#m-size",
  "rawBlockDevice.devicePath": "#m-device", rawBlockDevice: "#m-device", fsType: "#m-fs", mkfsOptions: "#m-mkfs",
  "lvmLogicalVolume.size": "#m-size", "lvmLogicalVolume.vgName": "#m-vg", lvmLogicalVolume: "#m-vg",
  encryption: "#m-enc", "encryption.provider": "#m-enc" };

function formValues() {
  const kind = document.querySelector('input[name="kind"]:checked').value;
  return { kind, name: $("#f-name").value.trim(), size: $("#f-size").value.trim(), device: $("#f-device").value.trim(), vg: $("#f-vg").value.trim(),
    mode: $("#f-mode").value, fs: $("#f-fs").value, mkfs: $("#f-mkfs").value.trim(), enc: $("#f-enc").value };
}

// validate checks the create form: only field (name, size, device, vg)
// as it is typed in, every one on submit (which then goes to the first
// wrong one): a message for a field not reached yet, read out at each
// key, helps nobody.
function validate(field) {
  const f = formValues();
  const msgs = { name: "", size: "", device: "", fs: "", vg: "" };
  if (!f.name) msgs.name = "Required: lowercase letters, digits and '-'.";
  else if (f.name.length > 63 || !/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(f.name))
    msgs.name = "Use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit.";
  else if (state.volumes.has(f.name)) msgs.name = `A volume named ${f.name} already exists.`;
  if (f.kind === "lvm") {
    if (!f.vg) msgs.vg = "Required: a volume group on the node (vgs lists them).";
    else if (!/^[A-Za-z0-9+_.][A-Za-z0-9+_.-]*$/.test(f.vg)) msgs.vg = "Use letters, digits and + _ . - as vgs shows the name.";
  }
  if (f.kind === "sparse" || f.kind === "lvm") {
    const n = parseSize(f.size);
    if (!f.size) msgs.size = "Required, e.g. 10Gi or 500M.";
    else if (isNaN(n)) msgs.size = "Use a number with an optional unit: Ki Mi Gi Ti or k M G T (e.g. 10Gi).";
    else if (f.mode === "Block" && n < 4 * 2 ** 20) msgs.size = "A Block volume needs at least 4Mi.";
    else if (f.mode === "Filesystem" && f.fs === "xfs" && n < 300 * 2 ** 20) msgs.size = "xfs needs at least 300Mi; use a larger size or ext4.";
    else if (f.mode === "Filesystem" && n < 2 ** 20) msgs.size = "A filesystem needs at least 1Mi.";
  } else if (!f.device) msgs.device = "Required: the device on the node, e.g. /dev/sdb or /dev/disk/by-id/...";
  else if (!f.device.startsWith("/dev/")) msgs.device = "Give a path under /dev/.";
  const fields = [["name", "#f-name", "#m-name"], ["size", "#f-size", "#m-size"], ["device", "#f-device", "#m-device"], ["vg", "#f-vg", "#m-vg"]];
  for (const [k, input, msg] of fields) {
    if (field && field !== k) continue;
    setText(msg, msgs[k]);
    $(input).setAttribute("aria-invalid", msgs[k] ? "true" : "false");
  }
  if (!field) {
    setText("#m-fs", "");
    setText("#m-mkfs", "");
    setText("#m-enc", "");
    const wrong = fields.find(([k]) => msgs[k]);
    if (wrong) $(wrong[1]).focus();
  }
  return !msgs.name && !msgs.size && !msgs.device && !msgs.vg;
}

// fieldOf is the create form's field an input event came from (the
// kind, mode and filesystem change what a size may be).
function fieldOf(target) {
  const id = target && target.id;
  if (id === "f-name") return "name";
  if (id === "f-device") return "device";
  if (id === "f-vg") return "vg";
  return $("#f-size").value.trim() ? "size" : "none";
}

function syncForm() {
  const f = formValues();
  $("#size-field").hidden = f.kind === "raw";
  $("#vg-field").hidden = f.kind !== "lvm";
  $("#device-field").hidden = f.kind !== "raw";
  $("#fs-field").hidden = f.mode === "Block";
  $("#mkfs-field").hidden = f.mode === "Block";
  $("#enc-field").hidden = f.kind !== "sparse";
}

async function submitCreate(e) {
  e.preventDefault();
  $("#create-error").textContent = "";
  if (!validate()) return;
  const f = formValues();
  const body = { name: f.name, node: state.node, mode: f.mode };
  if (f.kind === "sparse") body.sparseLoopDevice = { size: f.size };
  else if (f.kind === "lvm") body.lvmLogicalVolume = { vgName: f.vg, size: f.size };
  else body.rawBlockDevice = { devicePath: f.device };
  if (f.mode === "Filesystem") {
    body.fsType = f.fs;
    if (f.mkfs) body.mkfsOptions = f.mkfs.split(/\s+/);
  }
  if (f.kind === "sparse" && f.enc) body.encryption = { provider: f.enc };
  const r = await api("POST", "/api/v1/volumes", body);
  if (r.ok) {
    state.volumes.set(r.data.spec.name, r.data); // the watch stream confirms it
    $("#create-form").reset();
    syncForm();
    $("#create-form").hidden = true;
    render();
    setText("#list-status", `Volume ${r.data.spec.name} asked for on ${r.data.spec.node}: its row shows how it goes.`);
    $("#show-create").focus();
    return;
  }
  const err = (r.data && r.data.error) || { message: "HTTP " + r.status };
  const target = FIELD_MSG[err.field];
  if (target) $(target).textContent = err.message; else $("#create-error").textContent = err.message;
}

function logout(msg) {
  sessionStorage.removeItem("salt-volumes-token");
  state.token = "";
  state.who = null;
  // The detail page's timers would go on asking, each refusal logging
  // out again over this message.
  state.volume = null;
  $("#who").textContent = "";
  $("#logout").hidden = true;
  clearTimeout(state.retry);
  if (state.es) state.es.close();
  state.es = null;
  $("#login-error").textContent = msg || "";
  hideSecret();
  // Nothing the last session saw stays for the next one.
  state.snapshots = state.audit = state.tokens = null;
  for (const t of ["#snapshots tbody", "#audit tbody", "#tokens tbody"]) $(t).replaceChildren();
  for (const id of ["#audit-user", "#audit-volume", "#snap-filter", "#token-name", "#token-expires"]) $(id).value = "";
  for (const id of ["#m-audit", "#m-tokens", "#m-token", "#m-snapshots", "#audit-count", "#snap-count"]) $(id).textContent = "";
  route();
}

// ---- wiring ---------------------------------------------------------------

// whoami shows who the token is, and the log-out button; the actions
// its role allows show once it answers.
async function whoami() {
  const token = state.token;
  let r = null;
  try { r = await api("GET", "/api/v1/whoami"); } catch (e) { r = null; }
  // An answer for a token logged out since is not this one's.
  if (!state.token || state.token !== token) return;
  // The actions wait for its answer: ask again until there is one (a
  // refused token is logged out by the other requests).
  if (!r || (!r.ok && r.status !== 401)) { setTimeout(whoami, 2000); return; }
  if (!r.ok) return;
  state.who = r.data;
  $("#who").textContent = `${r.data.user} (${r.data.role || r.data.kind})`;
  $("#logout").hidden = false;
  render();
}

function init() {
  $("#salt-login-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    $("#salt-login-error").textContent = "";
    const resp = await fetch("/api/v1/login", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ username: $("#l-user").value.trim(), password: $("#l-password").value, eauth: $("#l-eauth").value.trim() }) });
    let data = null;
    try { data = await resp.json(); } catch (err) { data = null; }
    $("#l-password").value = "";
    if (!resp.ok) {
      $("#salt-login-error").textContent = (data && data.error && data.error.message) || "The server answered HTTP " + resp.status + ".";
      return;
    }
    state.token = data.token;
    sessionStorage.setItem("salt-volumes-token", state.token);
    whoami();
    connect();
    route();
  });
  $("#logout").addEventListener("click", async () => {
    // A session ends on the server too; a token is only forgotten here.
    if (state.who && state.who.kind === "session") await api("POST", "/api/v1/logout");
    logout("Logged out.");
  });
  $("#login-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    state.token = $("#token").value.trim();
    const r = await api("GET", "/api/v1/nodes");
    if (!r.ok) return logout(r.status === 401 ? "The token was refused." : "The server answered HTTP " + r.status + ".");
    sessionStorage.setItem("salt-volumes-token", state.token);
    whoami();
    connect();
    route();
  });
  $("#filter").addEventListener("input", (e) => { state.filter = e.target.value; render(); });
  $("#node-filter").addEventListener("change", (e) => { state.nodeFilter = e.target.value; render(); });
  $("#phase-filter").addEventListener("change", (e) => { state.phaseFilter = e.target.value; render(); });
  for (const b of document.querySelectorAll("#nodes th button")) {
    b.addEventListener("click", () => {
      const k = b.dataset.nsort;
      state.nodeSort = { key: k, dir: state.nodeSort.key === k ? -state.nodeSort.dir : 1 };
      render();
    });
  }
  for (const b of document.querySelectorAll("#volumes th button")) {
    b.addEventListener("click", () => {
      const k = b.dataset.sort;
      state.sort = { key: k, dir: state.sort.key === k ? -state.sort.dir : 1 };
      render();
    });
  }
  $("#show-create").addEventListener("click", () => {
    offerPlaces();
    $("#create-form").hidden = false;
    syncForm();
    $("#f-name").focus();
  });
  $("#cancel-create").addEventListener("click", () => { $("#create-form").hidden = true; $("#show-create").focus(); });
  $("#create-form").addEventListener("submit", submitCreate);
  $("#create-form").addEventListener("input", (e) => { syncForm(); validate(fieldOf(e.target)); });
  for (const [id, how] of [["#vol-delete", "delete"], ["#vol-wipe", "wipe"], ["#vol-forget", "forget"]]) {
    $(id).addEventListener("click", () => {
      const v = state.volumes.get(state.volume);
      if (v) confirmAction(v, how);
    });
  }
  $("#grow-form").addEventListener("submit", submitGrow);
  $("#restore-confirm").addEventListener("input", () => {
    $("#restore-wrong").textContent = "";
    $("#restore-ok").disabled = !state.restoreOf || $("#restore-confirm").value !== state.restoreOf.volume;
  });
  // Enter in the name field submits the form: only the exact name
  // restores, however the form is sent.
  $("#restore-form").addEventListener("submit", (e) => {
    if (!state.restoreOf || $("#restore-confirm").value !== state.restoreOf.volume) {
      e.preventDefault();
      setText("#restore-wrong", "Type the volume's name exactly, " + (state.restoreOf ? state.restoreOf.volume : "") + ", to restore it.");
    }
  });
  $("#restore-cancel").addEventListener("click", () => $("#restore-dialog").close());
  $("#restore-dialog").addEventListener("close", () => {
    // The close event is queued: a cancel's can arrive after the dialog
    // was opened again for the next restore, whose target it must keep.
    if ($("#restore-dialog").open) return;
    returnFocus();
    const of = state.restoreOf;
    state.restoreOf = null;
    if ($("#restore-dialog").returnValue === "ok" && of) submitRestore(of);
  });
  $("#snapshot-form").addEventListener("submit", submitSnapshot);
  $("#clone-form").addEventListener("submit", submitClone);
  $("#schedule-form").addEventListener("submit", submitSchedule);
  $("#snap-filter").addEventListener("input", () => render());
  $("#audit-form").addEventListener("submit", (e) => { e.preventDefault(); loadPage(); });
  $("#token-form").addEventListener("submit", submitToken);
  $("#token-secret-done").addEventListener("click", hideSecret);
  window.addEventListener("hashchange", hideSecret);
  $("#remove-schedule").addEventListener("click", removeSchedule);
  window.addEventListener("hashchange", route);
  // The skip link goes to the page's heading: a hash of its own would
  // be taken for a page.
  $("#skip").addEventListener("click", (e) => { e.preventDefault(); focusHeading(); });
  // Ages move on even when nothing else does; node reports and usage
  // arrive from the beacons, not on the watch stream.
  setInterval(() => {
    if (state.volume) refreshDetail();
    else if (state.page === "snapshots") loadPage();
    else if (state.node === null) loadNodes();
    else render();
  }, 30000);
  if (state.token) { whoami(); connect(); }
  route();
}

init();
