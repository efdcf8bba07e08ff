// salt-volumes web UI: plain JavaScript, no build step, no external assets.
// Everything live comes from the watch stream (server-sent events).
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = {
  token: sessionStorage.getItem("salt-volumes-token") || "",
  volumes: new Map(),
  nodes: [],
  sort: { key: "name", dir: 1 },
  filter: "",
  es: null,
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

function show(id) {
  for (const s of ["#login", "#nodes-view", "#node-view"]) $(s).hidden = s !== id;
}

// ---- watch stream ---------------------------------------------------------

function connect() {
  if (state.es) state.es.close();
  const es = new EventSource("/api/v1/watch?access_token=" + encodeURIComponent(state.token));
  state.es = es;
  let fresh = new Map();
  let synced = false;
  const apply = (type) => (msg) => {
    const ev = JSON.parse(msg.data);
    const v = ev.volume;
    if (!synced) { fresh.set(v.spec.name, v); return; }
    if (type === "DELETED") state.volumes.delete(v.spec.name);
    else state.volumes.set(v.spec.name, v);
    render();
  };
  es.addEventListener("ADDED", apply("ADDED"));
  es.addEventListener("MODIFIED", apply("MODIFIED"));
  es.addEventListener("DELETED", apply("DELETED"));
  es.addEventListener("SYNCED", () => {
    synced = true;
    state.volumes = fresh;
    fresh = new Map();
    $("#conn").textContent = "live";
    render();
  });
  es.onerror = () => {
    // The browser reconnects by itself; the list is sent again on reconnect.
    synced = false;
    fresh = new Map();
    $("#conn").textContent = "reconnecting…";
  };
}

// ---- views ----------------------------------------------------------------

function route() {
  if (!state.token) { show("#login"); $("#token").focus(); return; }
  const m = /^#\/node\/(.+)$/.exec(location.hash);
  if (m) { state.node = decodeURIComponent(m[1]); show("#node-view"); }
  else { state.node = null; show("#nodes-view"); loadNodes(); }
  render();
}

async function loadNodes() {
  const r = await api("GET", "/api/v1/nodes");
  if (r.status === 401) return logout("The token was refused.");
  if (r.ok) {
    state.nodes = r.data.items;
    $("#nodes-warning").textContent = r.data.warning || "";
    render();
  }
}

function render() {
  if (state.node === null) renderNodes(); else renderVolumes();
}

function renderNodes() {
  const byNode = new Map();
  for (const n of state.nodes) byNode.set(n.name, { name: n.name, up: n.up, phases: {} });
  for (const v of state.volumes.values()) {
    const n = byNode.get(v.spec.node) || { name: v.spec.node, up: false, phases: {} };
    n.phases[v.status.phase] = (n.phases[v.status.phase] || 0) + 1;
    byNode.set(n.name, n);
  }
  const tbody = $("#nodes tbody");
  tbody.replaceChildren();
  for (const n of [...byNode.values()].sort((a, b) => a.name.localeCompare(b.name))) {
    const count = Object.values(n.phases).reduce((a, b) => a + b, 0);
    const phases = Object.entries(n.phases).map(([p, c]) => p + " " + c).join(", ");
    tbody.append(el("tr", { "data-node": n.name },
      el("td", {}, el("a", { href: "#/node/" + encodeURIComponent(n.name), text: n.name })),
      el("td", { text: n.up ? "up" : "not responding" }),
      el("td", { text: String(count) }),
      el("td", { text: phases || "-" })));
  }
}

// pvText is the PV's phase and claim, "-" without one.
function pvText(pv) {
  if (!pv) return "-";
  if (pv.terminating) return "Terminating";
  return pv.claim ? pv.phase + " to " + pv.claim : pv.phase;
}

function row(v) {
  const s = v.status, sp = v.spec;
  return {
    name: sp.name,
    kind: sp.sparseLoopDevice ? "sparse" : "raw " + sp.rawBlockDevice.devicePath,
    mode: sp.mode,
    fs: sp.fsType || "-",
    size: s.size || parseSize(sp.sparseLoopDevice ? String(sp.sparseLoopDevice.size) : "") || 0,
    sizeText: s.size ? formatSize(s.size) : (sp.sparseLoopDevice ? String(sp.sparseLoopDevice.size) : "-"),
    phase: s.phase,
    pv: pvText(s.persistentVolume),
    step: s.step || "",
    device: s.deviceName || "",
    path: s.persistentPath || "",
    age: -Date.parse(v.createdAt),
    v,
  };
}

function renderVolumes() {
  $("#node-name").textContent = state.node;
  $("#create-node").textContent = state.node;
  const f = state.filter.toLowerCase();
  const rows = [...state.volumes.values()]
    .filter((v) => v.spec.node === state.node)
    .map(row)
    .filter((r) => !f || [r.name, r.kind, r.mode, r.fs, r.phase, r.pv, r.step, r.device, r.path, r.v.status.message || ""]
      .some((x) => String(x).toLowerCase().includes(f)));
  const { key, dir } = state.sort;
  rows.sort((a, b) => (a[key] < b[key] ? -dir : a[key] > b[key] ? dir : 0));
  const tbody = $("#volumes tbody");
  tbody.replaceChildren();
  for (const r of rows) {
    const s = r.v.status;
    const phase = el("td", {}, el("span", { class: "phase phase-" + r.phase, text: r.phase }));
    if (s.message) phase.append(el("span", { class: "reason", text: (s.reason ? s.reason + ": " : "") + s.message }));
    const del = el("button", { type: "button", class: "delete", "data-volume": r.name,
      disabled: !r.v.deletable, title: r.v.deletable ? "Delete " + r.name : r.v.deleteBlockedReason,
      "aria-describedby": r.v.deletable ? null : "why-" + r.name }, "Delete");
    del.addEventListener("click", () => confirmDelete(r.v));
    const actions = el("td", {}, del);
    if (!r.v.deletable) actions.append(el("span", { class: "reason", id: "why-" + r.name, text: r.v.deleteBlockedReason }));
    tbody.append(el("tr", { "data-volume": r.name, "data-phase": r.phase },
      el("td", { text: r.name }), el("td", { text: r.kind }), el("td", { text: r.mode }), el("td", { text: r.fs }),
      el("td", { text: r.sizeText }), phase, el("td", { class: "pv", text: r.pv }), el("td", { class: "step", text: r.step }), el("td", { text: r.device }),
      el("td", {}, r.path ? el("code", { class: "path", text: r.path }) : ""), el("td", { text: age(r.v.createdAt) }),
      actions));
  }
  $("#empty").hidden = rows.length > 0 || state.filter !== "";
  for (const b of document.querySelectorAll("th button")) {
    const th = b.parentElement;
    th.setAttribute("aria-sort", b.dataset.sort === key ? (dir > 0 ? "ascending" : "descending") : "none");
  }
}

// ---- delete ---------------------------------------------------------------

function confirmDelete(v) {
  const dlg = $("#confirm");
  $("#confirm-text").textContent = `Delete volume ${v.spec.name} on node ${v.spec.node}? ` +
    (v.spec.sparseLoopDevice ? "Its sparse file and all data in it are removed." : "The device is released; its data stays unless wiped.");
  dlg.returnValue = "";
  dlg.onclose = async () => {
    if (dlg.returnValue !== "ok") return;
    const r = await api("DELETE", "/api/v1/volumes/" + encodeURIComponent(v.spec.name));
    if (!r.ok) alertError(r);
  };
  dlg.showModal();
  $("#confirm-cancel").focus();
}

function alertError(r) {
  const msg = r.data && r.data.error ? r.data.error.message : "HTTP " + r.status;
  $("#create-error").textContent = msg;
}

// ---- create ---------------------------------------------------------------

const FIELD_MSG = { name: "#m-name", "sparseLoopDevice.size": "#m-size", "sparseLoopDevice": "#m-size",
  "rawBlockDevice.devicePath": "#m-device", rawBlockDevice: "#m-device", fsType: "#m-fs", mkfsOptions: "#m-mkfs" };

function formValues() {
  const kind = document.querySelector('input[name="kind"]:checked').value;
  return { kind, name: $("#f-name").value.trim(), size: $("#f-size").value.trim(), device: $("#f-device").value.trim(),
    mode: $("#f-mode").value, fs: $("#f-fs").value, mkfs: $("#f-mkfs").value.trim() };
}

function validate() {
  const f = formValues();
  const msgs = { name: "", size: "", device: "", fs: "" };
  if (!f.name) msgs.name = "Required: lowercase letters, digits and '-'.";
  else if (f.name.length > 63 || !/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(f.name))
    msgs.name = "Use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit.";
  else if (state.volumes.has(f.name)) msgs.name = `A volume named ${f.name} already exists.`;
  if (f.kind === "sparse") {
    const n = parseSize(f.size);
    if (!f.size) msgs.size = "Required, e.g. 10Gi or 500M.";
    else if (isNaN(n)) msgs.size = "Use a number with an optional unit: Ki Mi Gi Ti or k M G T (e.g. 10Gi).";
    else if (f.mode === "Block" && n < 4 * 2 ** 20) msgs.size = "A Block volume needs at least 4Mi.";
    else if (f.mode === "Filesystem" && f.fs === "xfs" && n < 300 * 2 ** 20) msgs.size = "xfs needs at least 300Mi; use a larger size or ext4.";
    else if (f.mode === "Filesystem" && n < 2 ** 20) msgs.size = "A filesystem needs at least 1Mi.";
  } else if (!f.device) msgs.device = "Required: the device on the node, e.g. /dev/sdb or /dev/disk/by-id/...";
  else if (!f.device.startsWith("/dev/")) msgs.device = "Give a path under /dev/.";
  $("#m-name").textContent = msgs.name;
  $("#m-size").textContent = msgs.size;
  $("#m-device").textContent = msgs.device;
  $("#m-fs").textContent = "";
  $("#m-mkfs").textContent = "";
  $("#f-name").setAttribute("aria-invalid", msgs.name ? "true" : "false");
  $("#f-size").setAttribute("aria-invalid", msgs.size ? "true" : "false");
  $("#f-device").setAttribute("aria-invalid", msgs.device ? "true" : "false");
  return !msgs.name && !msgs.size && !msgs.device;
}

function syncForm() {
  const f = formValues();
  $("#size-field").hidden = f.kind !== "sparse";
  $("#device-field").hidden = f.kind !== "raw";
  $("#fs-field").hidden = f.mode === "Block";
  $("#mkfs-field").hidden = f.mode === "Block";
}

async function submitCreate(e) {
  e.preventDefault();
  $("#create-error").textContent = "";
  if (!validate()) return;
  const f = formValues();
  const body = { name: f.name, node: state.node, mode: f.mode };
  if (f.kind === "sparse") body.sparseLoopDevice = { size: f.size };
  else body.rawBlockDevice = { devicePath: f.device };
  if (f.mode === "Filesystem") {
    body.fsType = f.fs;
    if (f.mkfs) body.mkfsOptions = f.mkfs.split(/\s+/);
  }
  const r = await api("POST", "/api/v1/volumes", body);
  if (r.ok) {
    state.volumes.set(r.data.spec.name, r.data); // the watch stream confirms it
    $("#create-form").reset();
    syncForm();
    $("#create-form").hidden = true;
    render();
    return;
  }
  const err = (r.data && r.data.error) || { message: "HTTP " + r.status };
  const target = FIELD_MSG[err.field];
  if (target) $(target).textContent = err.message; else $("#create-error").textContent = err.message;
}

function logout(msg) {
  sessionStorage.removeItem("salt-volumes-token");
  state.token = "";
  if (state.es) state.es.close();
  $("#login-error").textContent = msg || "";
  route();
}

// ---- wiring ---------------------------------------------------------------

function init() {
  $("#login-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    state.token = $("#token").value.trim();
    const r = await api("GET", "/api/v1/nodes");
    if (!r.ok) return logout(r.status === 401 ? "The token was refused." : "The server answered HTTP " + r.status + ".");
    sessionStorage.setItem("salt-volumes-token", state.token);
    connect();
    route();
  });
  $("#filter").addEventListener("input", (e) => { state.filter = e.target.value; render(); });
  for (const b of document.querySelectorAll("th button")) {
    b.addEventListener("click", () => {
      const k = b.dataset.sort;
      state.sort = { key: k, dir: state.sort.key === k ? -state.sort.dir : 1 };
      render();
    });
  }
  $("#show-create").addEventListener("click", () => {
    $("#create-form").hidden = false;
    syncForm();
    $("#f-name").focus();
  });
  $("#cancel-create").addEventListener("click", () => { $("#create-form").hidden = true; });
  $("#create-form").addEventListener("submit", submitCreate);
  $("#create-form").addEventListener("input", () => { syncForm(); validate(); });
  window.addEventListener("hashchange", route);
  // Ages move on even when nothing else does.
  setInterval(() => { if (state.node !== null) renderVolumes(); }, 30000);
  if (state.token) connect();
  route();
}

init();
