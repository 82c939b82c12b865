/* dyntc console: sign-in and writes through the JSON API with the bearer token.
   The token is kept in this tab's sessionStorage only: never in a URL or a cookie. */
(function () {
  'use strict';
  var KEY = 'dyntc-token', FLASH = 'dyntc-flash';
  var body = document.body;

  function token() { return sessionStorage.getItem(KEY); }
  function $(id) { return document.getElementById(id); }
  function enc(name) { return encodeURIComponent(name); }
  function lines(text) { return text.split('\n').map(function (s) { return s.trim(); }).filter(Boolean); }
  function checked(form, name) {
    return Array.prototype.filter.call(form.querySelectorAll('input[name="' + name + '"]'),
      function (el) { return el.checked; }).map(function (el) { return el.value; });
  }

  function headers(json, candidate) {
    var h = { 'Accept': 'application/json' };
    if (json) { h['Content-Type'] = 'application/json'; }
    var t = candidate || token();
    if (t) { h['Authorization'] = 'Bearer ' + t; }
    return h;
  }

  function explain(status, message) {
    if (status === 401) { return 'The service refused the token (401): ' + message + ' Sign in again with the service\'s current token.'; }
    if (status === 403) { return 'The service refused this change (403): ' + message; }
    if (status === 404) { return 'Not found (404): ' + message; }
    if (status === 409) { return 'Conflict (409): ' + message; }
    if (status === 413) { return 'Too large for this service (413): ' + message; }
    if (status >= 500) { return 'The service failed (' + status + '): ' + message; }
    return message + ' (' + status + ')';
  }

  function api(method, path, payload, candidate) {
    var init = { method: method, headers: headers(payload !== undefined, candidate), credentials: 'omit', cache: 'no-store' };
    if (payload !== undefined) { init.body = JSON.stringify(payload); }
    return fetch(path, init).then(function (resp) {
      return resp.text().then(function (text) {
        var data = null;
        try { data = JSON.parse(text); } catch (e) { data = null; }
        if (!resp.ok) {
          var message = (data && data.error) || ('HTTP ' + resp.status + ' ' + resp.statusText);
          var err = new Error(explain(resp.status, message));
          err.status = resp.status;
          throw err;
        }
        return data;
      });
    }, function (e) {
      throw new Error('The service did not answer (' + e.message + '): is dyntc serve still running?');
    });
  }

  function showError(message) {
    var el = $('error');
    el.textContent = message;
    el.hidden = false;
    el.focus();
  }
  function clearMessages() { $('error').hidden = true; $('error').textContent = ''; $('status').textContent = ''; }
  function showStatus(message) { $('status').textContent = message; }

  /* Pages that need the token are fetched again with it and their <main> swapped in. */
  function needsFetch() { return body.dataset.locked === '1' || (body.dataset.readToken === '1' && token()); }

  function load(url, push) {
    return fetch(url, { headers: headers(false), credentials: 'omit', cache: 'no-store' }).then(function (resp) {
      return resp.text();
    }).then(function (html) {
      var doc = new DOMParser().parseFromString(html, 'text/html');
      var main = doc.getElementById('main');
      if (!main) { throw new Error('The service sent a page the console cannot show.'); }
      $('main').replaceWith(document.adoptNode(main));
      document.title = doc.title;
      body.dataset.locked = doc.body.dataset.locked;
      if (push) { history.pushState({}, '', url); }
      wire($('main'));
    }).catch(function (e) { showError(e.message); });
  }

  function go(url, message) {
    if (message) { sessionStorage.setItem(FLASH, message); }
    if (token() && needsFetch()) {
      if (message) { showStatus(message); sessionStorage.removeItem(FLASH); }
      return load(url, url !== location.pathname + location.search);
    }
    if (url === location.pathname + location.search) { location.reload(); } else { location.assign(url); }
  }

  /* Each form's change, as one call of the JSON API. */
  var builders = {
    'add-label': function (f) {
      var name = f.elements.name.value.trim();
      return { method: 'POST', path: '/labels', body: { name: name, examples: lines(f.elements.examples.value) },
        next: '/console/labels/' + enc(name), done: 'Label ' + name + ' added' };
    },
    'add-examples': function (f) {
      var ex = lines(f.elements.examples.value);
      return { method: 'POST', path: '/labels/' + enc(f.dataset.label) + '/examples', body: { examples: ex },
        done: ex.length + ' example(s) added' };
    },
    'remove-examples': function (f) {
      var ex = checked(f, 'example');
      if (!ex.length) { throw new Error('Select the examples to remove first.'); }
      return { method: 'POST', path: '/labels/' + enc(f.dataset.label) + '/examples/remove', body: { examples: ex },
        done: ex.length + ' example(s) removed' };
    },
    'rename': function (f) {
      var to = f.elements.to.value.trim();
      return { method: 'POST', path: '/labels/' + enc(f.dataset.label) + '/rename', body: { to: to },
        next: '/console/labels/' + enc(to), done: 'Renamed to ' + to };
    },
    'remove-label': function (f) {
      return { method: 'DELETE', path: '/labels/' + enc(f.dataset.label), next: '/',
        confirm: 'Remove the label ' + f.dataset.label + '? Its examples leave the model (an earlier version can be restored).',
        confirmLabel: 'Remove', done: 'Label ' + f.dataset.label + ' removed' };
    },
    'merge': function (f) {
      var names = checked(f, 'label'), into = f.elements.into.value.trim();
      if (names.length < 2) { throw new Error('Select at least two labels to merge.'); }
      return { method: 'POST', path: '/labels/merge', body: { names: names, into: into },
        next: '/console/labels/' + enc(into), done: names.join(', ') + ' merged into ' + into };
    },
    'split': function (f) {
      var a = f.elements.part_a.value.trim(), b = f.elements.part_b.value.trim(), parts = {};
      if (a === b) { throw new Error('The two new labels need different names.'); }
      parts[a] = []; parts[b] = [];
      Array.prototype.forEach.call(f.querySelectorAll('select[name="part"]'), function (s) {
        if (s.value === 'a') { parts[a].push(s.dataset.text); }
        if (s.value === 'b') { parts[b].push(s.dataset.text); }
      });
      if (!parts[a].length || !parts[b].length) { throw new Error('Each new label needs at least one example.'); }
      return { method: 'POST', path: '/labels/' + enc(f.dataset.label) + '/split', body: { parts: parts },
        next: '/', done: f.dataset.label + ' split into ' + a + ' and ' + b };
    },
    'captures': function (f, submitter) {
      var texts = checked(f, 'text'), action = submitter ? submitter.value : 'accept';
      if (action === 'clear') {
        return { method: 'DELETE', path: '/captures', confirm: 'Forget every captured text?', confirmLabel: 'Clear',
          done: 'Inbox cleared' };
      }
      if (!texts.length) { throw new Error('Select captured texts first.'); }
      if (action === 'dismiss') {
        return { method: 'POST', path: '/captures/dismiss', body: { texts: texts }, done: texts.length + ' text(s) dismissed' };
      }
      if (action === 'out-of-scope') { return outOfScope(texts); }
      return accept(texts, f.elements.name.value.trim(), f.elements.into.value.trim());
    }
  };

  function outOfScope(texts) {
    return { method: 'POST', path: '/captures/out-of-scope', body: { texts: texts },
      done: texts.length + ' text(s) kept as out of scope: requests like them are rejected' };
  }

  function accept(texts, name, into) {
    // an existing label, when one is given, wins over the new name (which a cluster comes with)
    if (!name && !into) { throw new Error('Give a new label name, or the existing label to add the texts to.'); }
    var payload = { texts: texts };
    if (into) { payload.into = into; name = ''; } else { payload.name = name; }
    return { method: 'POST', path: '/discover/accept', body: payload,
      done: texts.length + ' text(s) ' + (name ? 'now label ' + name : 'added to ' + into) };
  }

  function confirmThen(message, label) {
    var dialog = $('confirm');
    if (!dialog || !dialog.showModal) { return Promise.resolve(window.confirm(message)); }
    $('confirm-text').textContent = message;
    $('confirm-ok').textContent = label || 'OK';
    return new Promise(function (resolve) {
      dialog.addEventListener('close', function once() {
        dialog.removeEventListener('close', once);
        resolve(dialog.returnValue === 'ok');
      });
      dialog.returnValue = '';
      dialog.showModal();
      $('confirm-cancel').focus();
    });
  }

  function perform(change) {
    var start = change.confirm ? confirmThen(change.confirm, change.confirmLabel) : Promise.resolve(true);
    return start.then(function (ok) {
      if (!ok) { return; }
      showStatus('Saving…');
      return api(change.method, change.path, change.body).then(function (data) {
        var message = change.done + (data && data.version ? ' (version ' + data.version + ')' : '') + '.';
        return go(change.next || (location.pathname + location.search), message);
      });
    }).catch(function (e) { showStatus(''); showError(e.message); });
  }

  function requireToken() {
    if (!token()) { throw new Error('Sign in with the service\'s token first.'); }
  }

  function onSubmit(event) {
    var form = event.target, kind = form.dataset.kind;
    if (!kind) { return; }
    event.preventDefault();
    clearMessages();
    try {
      if (kind === 'try') { return tryIt(form); }
      if (kind === 'discover') { requireToken(); return window.dyntcInbox.discover(form); }
      requireToken();
      perform(builders[kind](form, event.submitter));
    } catch (e) { showError(e.message); }
  }

  /* Try it */
  function tryIt(form) {
    var text = form.elements.text.value.trim();
    if (!text) { showError('Type a text first.'); return; }
    var calibrated = form.dataset.calibrated === '1';
    var k = Number(form.dataset.k);
    // ranking: each label's probability, where this dyntc answers it (older services ignore the field)
    api('POST', '/predict', { texts: [text], top_k: k, proba: true, ranking: k, reject: calibrated }).then(function (data) {
      var r = data.results[0], rows = $('try-table').tBodies[0], confidence = {};
      (r.ranking || []).forEach(function (x) { confidence[x.label] = x.confidence; });
      $('try-confidence').hidden = !r.ranking;
      rows.textContent = '';
      (r.top_k || [{ label: r.label, distance: null }]).forEach(function (t, i) {
        var tr = rows.insertRow();
        tr.insertCell().textContent = String(i + 1);
        tr.insertCell().textContent = t.label;
        var c = tr.insertCell(); c.className = 'num'; c.hidden = !r.ranking;
        c.textContent = confidence[t.label] === undefined ? '' : confidence[t.label].toFixed(3);
        var d = tr.insertCell(); d.className = 'num'; d.textContent = t.distance === null ? '' : t.distance.toFixed(3);
      });
      var best = (r.top_k ? r.top_k[0].label : r.label);
      var verdict = r.label === null ? 'Rejected: out of scope (nearest label: ' + best + ').'
        : 'Label: ' + r.label + (r.probability !== undefined ? ' (probability ' + r.probability.toFixed(2) + ')' : '') +
          (calibrated ? ', not rejected.' : '.');
      $('try-verdict').textContent = verdict;
      $('try-verdict').dataset.label = r.label === null ? '' : r.label;
      $('try-results').hidden = false;
    }).catch(function (e) { showError(e.message); });
  }

  /* Restore buttons (versions page) */
  function onClick(event) {
    var target = event.target;
    if (target.dataset && target.dataset.kind === 'restore') {
      clearMessages();
      try {
        requireToken();
        var v = target.dataset.version;
        perform({ method: 'POST', path: '/versions/' + v + '/restore', next: '/console/versions',
          confirm: 'Restore version ' + v + '? Its labels and examples become a new version; nothing is deleted.',
          confirmLabel: 'Restore', done: 'Version ' + v + ' restored' });
      } catch (e) { showError(e.message); }
      return;
    }
    if (target.id === 'suggest-button') { window.dyntcInbox.suggest(); return; }
    var link = target.closest && target.closest('a[href]');
    if (link && token() && body.dataset.readToken === '1' && link.origin === location.origin && !link.pathname.startsWith('/docs')) {
      event.preventDefault();
      clearMessages();
      load(link.pathname + link.search, true);
    }
  }

  /* Sign in */
  function setSignedIn() {
    var on = !!token();
    var signin = $('signin'), signed = $('signed-in');
    if (signin) { signin.hidden = on; }
    if (signed) { signed.hidden = !on; }
    Array.prototype.forEach.call(document.querySelectorAll('fieldset.write, button.restore'), function (node) {
      node.disabled = !(on && body.dataset.writable === '1');
    });
  }

  function wire(root) { setSignedIn(); window.dyntcInbox.resumeJob(); }

  function signIn(event) {
    event.preventDefault();
    clearMessages();
    var candidate = event.target.elements.token.value.trim();
    api('GET', '/console/whoami', undefined, candidate).then(function (data) {
      if (!(data.write || (data.read && body.dataset.writable !== '1'))) {
        throw new Error('The service does not accept this token: check it and sign in again.');
      }
      sessionStorage.setItem(KEY, candidate);
      event.target.reset();
      setSignedIn();
      showStatus('Signed in.');
      if (needsFetch()) { load(location.pathname + location.search, false); }
    }).catch(function (e) { showError(e.message); });
  }

  function signOut() {
    sessionStorage.removeItem(KEY);
    location.reload();
  }

  document.addEventListener('DOMContentLoaded', function () {
    document.addEventListener('submit', onSubmit);
    document.addEventListener('click', onClick);
    if ($('signin')) { $('signin').addEventListener('submit', signIn); }
    if ($('signout')) { $('signout').addEventListener('click', signOut); }
    window.addEventListener('popstate', function () { if (token() && needsFetch()) { load(location.pathname + location.search, false); } });
    var flash = sessionStorage.getItem(FLASH);
    if (flash) { sessionStorage.removeItem(FLASH); showStatus(flash); }
    setSignedIn();
    if (token() && needsFetch()) { load(location.pathname + location.search, false); }
    body.dataset.ready = '1';
  });

  /* What the inbox's script (inbox.js) uses. */
  window.dyntcConsole = { $: $, api: api, enc: enc, checked: checked, showStatus: showStatus, showError: showError,
    clearMessages: clearMessages, requireToken: requireToken, perform: perform, accept: accept, outOfScope: outOfScope };
})();
