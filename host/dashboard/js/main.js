// The dashboard shell: sign-in, the view in the URL's hash, and the live event feed that
// tells the open view to refresh.

import { ApiError, closeSocket, forgetKey, gql, saveKey, savedKey, subscribe } from "./api.js";
import { esc } from "./format.js";
import * as overview from "./overview.js";
import * as policies from "./policies.js";
import * as reservations from "./reservations.js";
import * as timeline from "./timeline.js";

const VIEWS = { overview, timeline, reservations, policies };
const $ = (id) => document.getElementById(id);

let viewer = null;
let current = null;
let unsubscribe = null;

async function signIn(key) {
  saveKey(key);
  try {
    const { data } = await gql("{ viewer { keyId orgId permissions ops } }");
    viewer = data.viewer;
  } catch (e) {
    forgetKey();
    throw e;
  }
  $("viewer").innerHTML = `<strong>${esc(viewer.orgId)}</strong> <span class="muted">· key ${esc(viewer.keyId)}</span>`;
  $("sign-in").hidden = true;
  $("tabs").hidden = false;
  $("who").hidden = false;
  for (const view of Object.values(VIEWS)) view.setViewer?.(viewer);
  follow();
  route();
}

function signOut() {
  if (unsubscribe) unsubscribe();
  unsubscribe = null;
  closeSocket();
  forgetKey();
  viewer = null;
  location.hash = "";
  location.reload();
}

/** One subscription for the whole session; each event asks the open view to refresh. */
function follow() {
  const live = $("live");
  const status = (s) => {
    live.className = `live ${s}`;
    live.title = { live: "Live: changes arrive as they happen", connecting: "Connecting to live updates…", down: "Live updates are down; retrying" }[s];
  };
  unsubscribe = subscribe(
    "subscription { reservationEvents { id type objectId at } }",
    (data) => current?.onEvent?.(data.reservationEvents),
    (e) => { status("down"); console.warn(e.message); },
    status,
  );
}

function route() {
  if (!viewer) return;
  const name = VIEWS[location.hash.slice(1)] ? location.hash.slice(1) : "overview";
  for (const [n, view] of Object.entries(VIEWS)) {
    const section = $(`view-${n}`);
    const active = n === name;
    section.hidden = !active;
    document.querySelector(`#tabs a[data-view="${n}"]`).setAttribute("aria-current", active ? "page" : "false");
    if (!active) view.hide?.();
  }
  current = VIEWS[name];
  current.show();
}

$("sign-in-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const error = $("sign-in-error");
  error.hidden = true;
  const key = $("api-key").value.trim();
  try {
    await signIn(key);
    $("api-key").value = "";
  } catch (e) {
    error.textContent = e instanceof ApiError ? e.message : `Sign-in failed: ${e.message}`;
    error.hidden = false;
    $("api-key").focus();
  }
});
$("sign-out").addEventListener("click", signOut);
window.addEventListener("hashchange", route);

const key = savedKey();
if (key) {
  signIn(key).catch((e) => {
    $("sign-in").hidden = false;
    $("sign-in-error").textContent = e.message;
    $("sign-in-error").hidden = false;
  });
} else {
  $("sign-in").hidden = false;
  $("api-key").focus();
}
