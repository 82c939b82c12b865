/* dyntc console: sign-in and writes through the JSON API with the bearer token.
   The token is kept in this tab's sessionStorage only: never in a URL or a cookie. */
(function () {
  'use strict';
  var KEY = 'dyntc-token', FLASH = 'dyntc-flash', JOB = 'dyntc-discovery-job';
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
      return accept(texts, f.elements.name.value.trim(), f.elements.into.value.trim());
    }
  };

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
      if (kind === 'discover') { requireToken(); return discover(form); }
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

  /* Inbox: proposed clusters and suggestions */
  function el(tag, text, attrs) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) { node.textContent = text; }
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    return node;
  }

  /* A discovery that adapts the model first is a job of minutes: read it until it ends, while the
     inbox is shown (its url kept in this tab, so that coming back to the inbox picks it up again). */
  function finished(job) {
    if (!$('clusters')) { return null; }
    if (job.status !== 'running') { sessionStorage.removeItem(JOB); }
    if (job.status === 'done') { return job.result; }
    if (job.status === 'failed') { throw new Error('The discovery failed: ' + job.error); }
    sessionStorage.setItem(JOB, job.url);
    showStatus('Adapting the model to the captured texts, then grouping them… ' + Math.round(job.seconds) + ' s so far.');
    return new Promise(function (resolve) { setTimeout(resolve, 2000); }).then(function () {
      return $('clusters') ? api('GET', job.url) : null;
    }).then(function (next) { return next && finished(next); });
  }

  function showClusters(data) {
    var box = $('clusters');
    if (!data || !box) { return; }
    showStatus('');
    box.textContent = '';
    var clusters = data.clusters || [];
    if (!clusters.length) { box.appendChild(el('p', 'No cluster found in the captured texts.')); }
    clusters.forEach(function (c, i) { box.appendChild(clusterForm(c, i)); });
  }

  function resumeJob() {
    var url = sessionStorage.getItem(JOB);
    if (!url || !$('clusters')) { return; }
    api('GET', url).then(finished).then(showClusters).catch(function (e) {
      sessionStorage.removeItem(JOB); showStatus(''); showError(e.message);
    });
  }

  function discover(form) {
    var n = form.elements.n_new.value, payload = {};
    var minutes = form.elements.adapt_min ? Number(form.elements.adapt_min.value || 0) : 0;
    if (n) { payload.n_new = Number(n); }
    if (minutes > 0) { payload.adapt_s = minutes * 60; }
    showStatus(minutes > 0 ? 'Adapting the model to the captured texts (about ' + minutes + ' min), then grouping them…'
      : 'Clustering the captured texts…');
    api('POST', '/discover', payload).then(function (data) {
      return data && data.job ? finished(data) : data;
    }).then(showClusters).catch(function (e) { showStatus(''); showError(e.message); });
  }

  function clusterForm(c, i) {
    var f = el('form', null, { 'class': 'cluster', id: 'cluster-' + i });
    var name = c.name || c.suggested_name || ('cluster ' + (i + 1));
    f.appendChild(el('h3', name));
    var facts = c.size + ' texts';
    if (typeof c.cohesion === 'number') { facts += ', cohesion ' + c.cohesion.toFixed(2); }
    if (c.nearest_label) {
      facts += ', nearest label ' + c.nearest_label +
        (typeof c.nearest_distance === 'number' ? ' (distance ' + c.nearest_distance.toFixed(2) + ')' : '');
    }
    f.appendChild(el('p', facts));
    if (c.keywords && c.keywords.length) { f.appendChild(el('p', 'Keywords: ' + c.keywords.join(', '))); }
    var list = el('ul');
    (c.texts || []).forEach(function (t, j) {
      var li = el('li'), box = el('input', null, { type: 'checkbox', name: 'text', id: 'c' + i + '-' + j });
      box.value = t; box.checked = true;
      li.appendChild(box); li.appendChild(el('label', t, { 'for': 'c' + i + '-' + j }));
      list.appendChild(li);
    });
    f.appendChild(list);
    var fs = el('fieldset'); fs.appendChild(el('legend', 'Accept this cluster'));
    fs.appendChild(el('label', 'As a new label named', { 'for': 'c' + i + '-name' }));
    var nameInput = el('input', null, { id: 'c' + i + '-name', name: 'name', maxlength: '100' }); nameInput.value = name;
    fs.appendChild(nameInput);
    fs.appendChild(el('label', 'or add to the label', { 'for': 'c' + i + '-into' }));
    fs.appendChild(el('input', null, { id: 'c' + i + '-into', name: 'into', list: 'label-names', maxlength: '100' }));
    fs.appendChild(el('button', 'Accept', { type: 'submit', name: 'action', value: 'accept' }));
    fs.appendChild(el('button', 'Dismiss', { type: 'submit', name: 'action', value: 'dismiss' }));
    f.appendChild(fs);
    f.addEventListener('submit', function (event) {
      event.preventDefault();
      clearMessages();
      try {
        requireToken();
        var texts = checked(f, 'text'), action = event.submitter ? event.submitter.value : 'accept';
        if (!texts.length) { throw new Error('Keep at least one text of the cluster.'); }
        if (action === 'dismiss') {
          perform({ method: 'POST', path: '/captures/dismiss', body: { texts: texts }, done: 'Cluster dismissed' });
        } else {
          perform(accept(texts, f.elements.name.value.trim(), f.elements.into.value.trim()));
        }
      } catch (e) { showError(e.message); }
    });
    return f;
  }

  function suggest() {
    clearMessages();
    showStatus('Looking for merges and splits…');
    api('GET', '/suggestions').then(function (data) {
      showStatus('');
      var box = $('suggestions');
      box.textContent = '';
      var items = data.suggestions || [];
      if (!items.length) { box.appendChild(el('p', 'No suggestion: the labels look distinct and coherent.')); }
      var list = el('ol');
      items.forEach(function (s, i) {
        var li = el('li', null, { 'class': 'suggestion', id: 'suggestion-' + i });
        li.appendChild(el('strong', s.kind + ': ' + s.labels.join(', ')));
        if (s.description) { li.appendChild(el('p', s.description)); }
        var ev = s.evidence || {}, dl = el('dl');
        Object.keys(ev).forEach(function (k) {
          dl.appendChild(el('dt', k.replace(/_/g, ' ')));
          dl.appendChild(el('dd', typeof ev[k] === 'object' ? JSON.stringify(ev[k]) : String(ev[k])));
        });
        li.appendChild(dl);
        var change = null;
        if (s.kind === 'merge' && s.labels.length >= 2) {
          change = { method: 'POST', path: '/labels/merge', body: { names: s.labels, into: s.labels[0] },
            done: s.labels.join(', ') + ' merged into ' + s.labels[0], label: 'Merge into ' + s.labels[0] };
        } else if (s.kind === 'split' && s.parts && Object.keys(s.parts).length >= 2) {
          change = { method: 'POST', path: '/labels/' + enc(s.labels[0]) + '/split', body: { parts: s.parts, reassign: true },
            done: s.labels[0] + ' split into ' + Object.keys(s.parts).join(', '),
            label: 'Split into ' + Object.keys(s.parts).join(' and ') };
        }
        if (change && body.dataset.writable === '1') {
          var button = el('button', change.label, { type: 'button' });
          button.addEventListener('click', function () {
            clearMessages();
            try { requireToken(); perform(change); } catch (e) { showError(e.message); }
          });
          li.appendChild(button);
        }
        list.appendChild(li);
      });
      box.appendChild(list);
    }).catch(function (e) { showStatus(''); showError(e.message); });
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
    if (target.id === 'suggest-button') { suggest(); return; }
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

  function wire(root) { setSignedIn(); resumeJob(); }

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
})();
