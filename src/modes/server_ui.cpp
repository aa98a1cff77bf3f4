// The page `kvrun server` answers GET / with: a small chat in the browser on the server's own
// /v1/chat/completions (streamed), so `kvrun server -m MODEL` then opening the address is a
// working chat, as llama.cpp's server offers. One self-contained HTML file, no external
// resources; the conversation lives in the page.
#include "modes/server.h"

namespace kvrun {

const char* server_ui_html() {
    return R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvrun</title>
<style>
  body { font: 15px/1.45 system-ui, sans-serif; margin: 0; display: flex; flex-direction: column;
         height: 100vh; background: #fafafa; color: #222; }
  header { padding: 8px 16px; background: #263238; color: #eee; font-size: 14px; }
  #log { flex: 1; overflow-y: auto; padding: 16px; }
  .msg { max-width: 52em; margin: 0 auto 12px; white-space: pre-wrap; padding: 8px 12px;
         border-radius: 8px; }
  .user { background: #e3f2fd; } .assistant { background: #fff; border: 1px solid #ddd; }
  .error { background: #ffebee; }
  .thinking { color: #78909c; font-style: italic; border-left: 3px solid #cfd8dc;
              padding-left: 8px; margin-bottom: 6px; }
  form { display: flex; gap: 8px; padding: 12px 16px; background: #eceff1; }
  textarea { flex: 1; font: inherit; padding: 8px; resize: vertical; min-height: 2.5em; }
  button { font: inherit; padding: 0 16px; }
  #stats { font-size: 12px; color: #90a4ae; margin-left: 8px; }
</style>
</head>
<body>
<header>kvrun server — <span id="model">…</span><span id="stats"></span></header>
<div id="log"></div>
<form id="form">
  <textarea id="input" placeholder="Message (Enter sends, Shift+Enter: new line)"></textarea>
  <button id="send">Send</button>
  <button id="reset" type="button">New chat</button>
</form>
<script>
const log = document.getElementById('log'), input = document.getElementById('input');
const send = document.getElementById('send'), stats = document.getElementById('stats');
let messages = [], busy = null;
const key = () => localStorage.getItem('kvrun-api-key');
fetch('v1/models').then(r => r.json()).then(j => {
  document.getElementById('model').textContent = j.data[0].id;
}).catch(() => {});
function add(role, text) {
  const d = document.createElement('div');
  d.className = 'msg ' + role;
  d.textContent = text;
  log.appendChild(d);
  log.scrollTop = log.scrollHeight;
  return d;
}
async function ask(text) {
  messages.push({role: 'user', content: text});
  add('user', text);
  const out = add('assistant', '');
  // A thinking model's reasoning (reasoning_content deltas) shows above its answer.
  const thinking = document.createElement('div'), answer = document.createElement('div');
  thinking.className = 'thinking';
  thinking.hidden = true;
  out.appendChild(thinking);
  out.appendChild(answer);
  busy = new AbortController();
  send.textContent = 'Stop';
  let reply = '', reasoning = '', n = 0;
  const t0 = performance.now();
  try {
    const post = () => fetch('v1/chat/completions', {
      method: 'POST', signal: busy.signal, body: JSON.stringify({messages, stream: true}),
      headers: Object.assign({'Content-Type': 'application/json'},
                             key() ? {'Authorization': 'Bearer ' + key()} : {})});
    let r = await post();
    if (r.status === 401) {  // a server started with --api-key
      localStorage.setItem('kvrun-api-key', prompt('API key') || '');
      r = await post();
    }
    if (!r.ok) throw new Error((await r.json()).error.message);
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let at;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, at); buf = buf.slice(at + 2);
        if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
        const j = JSON.parse(ev.slice(6));
        if (j.error) throw new Error(j.error.message);
        const c = j.choices && j.choices[0];
        if (c && c.delta && c.delta.reasoning_content) {
          reasoning += c.delta.reasoning_content; n++;
          thinking.hidden = false;
          thinking.textContent = reasoning;
          log.scrollTop = log.scrollHeight;
        }
        if (c && c.delta && c.delta.content) {
          reply += c.delta.content; n++;
          answer.textContent = reply;
          log.scrollTop = log.scrollHeight;
        }
      }
    }
    stats.textContent = ` · ${n} chunks in ${((performance.now() - t0) / 1000).toFixed(1)} s`;
  } catch (e) {
    if (e.name !== 'AbortError') { out.className = 'msg error'; out.textContent = String(e.message || e); }
  }
  messages.push({role: 'assistant', content: reply});
  busy = null;
  send.textContent = 'Send';
}
document.getElementById('form').onsubmit = e => {
  e.preventDefault();
  if (busy) { busy.abort(); return; }
  const text = input.value.trim();
  if (!text) return;
  input.value = '';
  ask(text);
};
input.onkeydown = e => {
  if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); document.getElementById('form').requestSubmit(); }
};
document.getElementById('reset').onclick = () => {
  if (busy) busy.abort();
  messages = []; log.innerHTML = ''; stats.textContent = '';
};
</script>
</body>
</html>
)HTML";
}

}  // namespace kvrun
