/* dyntc console, the inbox's part: proposed new labels (discovery, as a background job when the
   model is adapted first) and merge / split suggestions, through the helpers console.js exports. */
(function () {
  'use strict';
  var c = window.dyntcConsole, $ = c.$, api = c.api, enc = c.enc, checked = c.checked, showStatus = c.showStatus,
    showError = c.showError, clearMessages = c.clearMessages, requireToken = c.requireToken, perform = c.perform,
    accept = c.accept, outOfScope = c.outOfScope;
  var JOB = 'dyntc-discovery-job', body = document.body;

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
    if ($('clusters').dataset.calibrated === '1') {
      fs.appendChild(el('button', 'Out of scope', { type: 'submit', name: 'action', value: 'out-of-scope',
        title: 'No label should take them: requests like these are rejected from now on' }));
    }
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
        } else if (action === 'out-of-scope') {
          perform(outOfScope(texts));
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

  window.dyntcInbox = { discover: discover, suggest: suggest, resumeJob: resumeJob };
})();
