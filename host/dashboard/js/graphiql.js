// GraphiQL on embedded assets, with a field for the API key: queries and mutations go over
// HTTP with `Authorization: Bearer <key>`, subscriptions over graphql-ws with the key in
// `connection_init`. The key is kept in sessionStorage (this tab only), shared with the
// dashboard.
(function () {
  "use strict";
  var KEY = "orl.apiKey";
  var input = document.getElementById("key");
  var status = document.getElementById("key-status");
  var socket = null;

  function key() {
    return sessionStorage.getItem(KEY) || "";
  }

  function say(text, bad) {
    status.textContent = text;
    status.className = bad ? "bad" : "";
  }

  function wsClient() {
    if (socket) return socket;
    var url = (location.protocol === "https:" ? "wss" : "ws") + "://" + location.host + "/graphql";
    socket = window.graphqlWs.createClient({
      url: url,
      lazy: true,
      connectionParams: function () { return { Authorization: "Bearer " + key() }; },
    });
    return socket;
  }

  function isSubscription(params) {
    return /^\s*subscription\b/m.test(params.query || "") &&
      !/^\s*(query|mutation)\b/m.test(params.query || "");
  }

  function fetcher(params) {
    if (isSubscription(params)) {
      var client = wsClient();
      return {
        subscribe: function (sink) {
          var stop = client.subscribe(params, {
            next: function (v) { sink.next(v); },
            error: function (e) { sink.error(e instanceof Error ? e : new Error(e && e.reason || "the subscription socket closed")); },
            complete: function () { sink.complete(); },
          });
          return { unsubscribe: stop };
        },
      };
    }
    var headers = { "Content-Type": "application/json" };
    if (key()) headers.Authorization = "Bearer " + key();
    return fetch("/graphql", { method: "POST", headers: headers, body: JSON.stringify(params) })
      .then(function (r) { return r.json(); })
      .catch(function (e) { return { errors: [{ message: "The server cannot be reached: " + e.message }] }; });
  }

  document.getElementById("key-bar").addEventListener("submit", function (e) {
    e.preventDefault();
    sessionStorage.setItem(KEY, input.value.trim());
    input.value = "";
    if (socket) { socket.dispose(); socket = null; }
    check();
  });

  function check() {
    if (!key()) { say("No key: every operation will be refused.", true); return; }
    fetcher({ query: "{ viewer { orgId keyId } }" }).then(function (r) {
      if (r.data && r.data.viewer) say("Signed in as " + r.data.viewer.orgId + " (key " + r.data.viewer.keyId + ")");
      else say("This key is refused: " + (r.errors && r.errors[0] ? r.errors[0].message : "unknown error"), true);
    });
  }

  function start() {
    if (!window.React || !window.ReactDOM || !window.GraphiQL) {
      document.getElementById("graphiql").innerHTML = '<p class="loading">GraphiQL could not load its scripts.</p>';
      return;
    }
    var root = ReactDOM.createRoot(document.getElementById("graphiql"));
    root.render(React.createElement(GraphiQL, {
      fetcher: fetcher,
      defaultEditorToolsVisibility: true,
      defaultQuery: "# The caller, and the pools it sees.\n{\n  viewer { orgId keyId permissions }\n  pools(first: 20) { edges { node { id name } } }\n}\n",
    }));
    check();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
