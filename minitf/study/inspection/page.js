// minitf inspect: draws the page from the JSON in #inspect-data, with no library and no network.
// Charts are inline SVG made here; every string from the data goes in as text, never as HTML.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("inspect-data").textContent);
  const SVGNS = "http://www.w3.org/2000/svg";
  const page = document.getElementById("page");
  const tip = document.getElementById("tip");
  let uid = 0;

  // ------------------------------------------------------------------ small helpers
  function add(tag, attrs, parent, text, ns) {
    const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.setAttribute("class", value);
      else node.setAttribute(key, String(value));
    }
    if (text !== undefined && text !== null) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }
  const h = (tag, attrs, parent, text) => add(tag, attrs, parent, text);
  const s = (tag, attrs, parent, text) => add(tag, attrs, parent, text, SVGNS);

  function floats(encoded) {  // base64 little-endian float32 -> Float32Array
    const bin = atob(encoded.base64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Float32Array(bytes.buffer);
  }

  function fmt(x, digits) {
    if (x === null || x === undefined || Number.isNaN(x)) return "–";
    if (x === 0) return "0";
    const a = Math.abs(x);
    if (a >= 1e5 || a < 1e-3) return Number(x.toPrecision(digits || 3)).toExponential();
    return String(Number(x.toPrecision(digits || 3)));
  }

  function show(piece) {  // a token as text one can see (its hidden characters came escaped: page.visible)
    if (piece === null || piece === undefined) return "";
    if (piece === "") return "∅";
    return piece.replace(/^ /, "␣");
  }

  function clip(text, n) { return text.length > n ? text.slice(0, n - 1) + "…" : text; }

  function showTip(event, text) {
    tip.textContent = text;
    tip.hidden = false;
    const x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = Math.min(event.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  function hideTip() { tip.hidden = true; }
  function tipOn(node, textOf) {  // textOf(event target) -> text or null
    node.addEventListener("mousemove", (event) => {
      const text = textOf(event.target);
      if (text) showTip(event, text); else hideTip();
    });
    node.addEventListener("mouseleave", hideTip);
  }

  // colour scales: white to dark blue (attention), white to dark green (probability)
  const BLUES = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
  const GREENS = [[247, 252, 245], [199, 233, 192], [116, 196, 118], [35, 139, 69], [0, 68, 27]];
  function colour(stops, t) {
    t = Math.max(0, Math.min(1, Number.isFinite(t) ? t : 0));
    const at = t * (stops.length - 1), i = Math.min(Math.floor(at), stops.length - 2), f = at - i;
    const c = stops[i].map((v, k) => Math.round(v + f * (stops[i + 1][k] - v)));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }
  const darkOn = (t) => t > 0.55;  // white text on a dark cell

  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + 1; }
    const raw = (hi - lo) / (n || 5), mag = Math.pow(10, Math.floor(Math.log10(raw))), r = raw / mag;
    const step = (r >= 7.5 ? 10 : r >= 3.5 ? 5 : r >= 1.5 ? 2 : 1) * mag;
    const out = [];
    for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
    return out;
  }

  function logTicks(lo, hi) {  // tick positions (log10 units) at 1, 2, 5 x 10^k, fewer over many decades
    const decades = hi - lo, out = [];
    const mults = decades > 4 ? [1] : decades > 2 ? [1, 3] : [1, 2, 5];
    for (let p = Math.floor(lo); p <= Math.ceil(hi); p++) {
      for (const m of mults) {
        const v = p + Math.log10(m);
        if (v >= lo - 1e-9 && v <= hi + 1e-9) out.push(v);
      }
    }
    if (out.length >= 2) return out;
    return niceTicks(Math.pow(10, lo), Math.pow(10, hi), 4).filter((v) => v > 0).map(Math.log10);
  }

  function gradientLegend(parent, stops, left, right, label) {
    const legend = h("div", {class: "legend"}, parent);
    h("span", {}, legend, left);
    const svg = s("svg", {width: 160, height: 14, class: "chart", role: "img", "aria-label": label}, legend);
    const id = "grad" + (++uid);
    const gradient = s("linearGradient", {id: id}, s("defs", {}, svg));
    stops.forEach((c, i) => s("stop", {offset: i / (stops.length - 1), "stop-color": `rgb(${c.join(",")})`}, gradient));
    s("rect", {x: 0, y: 0, width: 160, height: 14, fill: `url(#${id})`, stroke: "#d0d7de"}, svg);
    h("span", {}, legend, right);
    h("span", {}, legend, "· " + label);
    return legend;
  }

  // ------------------------------------------------------------------ a line chart (linear x, linear or log y)
  function lineChart(parent, o) {
    const figure = h("figure", {class: "plot", "data-chart": o.id || ""}, parent);
    h("h3", {}, figure, o.title);
    if (o.caption) h("p", {class: "caption"}, figure, o.caption);
    const legend = h("div", {class: "legend"}, figure);
    for (const line of o.series) {  // a series with no point says so (a short run made no validation)
      const sw = h("span", {class: "swatch"}, legend);
      sw.style.background = line.colour;
      const drawn = line.ys.some((y) => y !== null && Number.isFinite(y));
      h("span", {}, legend, line.name + (drawn ? "" : " (none in this run)") + "  ");
    }
    const W = o.width || 520, H = o.height || 280, m = {l: 70, r: 16, t: 10, b: o.xcats ? 120 : 44};
    const svg = s("svg", {class: "chart", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
                          "aria-label": o.title}, figure);
    const xs = o.series.flatMap((line) => line.xs), ys = o.series.flatMap((line) => line.ys).filter(
      (y) => y !== null && Number.isFinite(y) && (!o.logy || y > 0));
    if (!ys.length) { s("text", {x: W / 2, y: H / 2, "text-anchor": "middle"}, svg, "no data"); return figure; }
    let x0 = Math.min(...xs), x1 = Math.max(...xs);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    let y0 = Math.min(...ys), y1 = Math.max(...ys), yt;
    if (o.logy) {
      y0 = Math.log10(y0); y1 = Math.log10(y1);
      const pad = Math.max(0.08, (y1 - y0) * 0.06);
      y0 -= pad; y1 += pad;
      yt = logTicks(y0, y1);
    } else {
      if (o.zero) y0 = Math.min(0, y0);
      const pad = (y1 - y0) * 0.05 || 1;
      y0 = o.zero && y0 === 0 ? 0 : y0 - pad; y1 += pad;
      yt = niceTicks(y0, y1, 5);
    }
    const X = (x) => m.l + (x - x0) / (x1 - x0) * (W - m.l - m.r);
    const Y = (y) => H - m.b - ((o.logy ? Math.log10(y) : y) - y0) / (y1 - y0) * (H - m.t - m.b);
    const axes = s("g", {}, svg);
    for (const v of yt) {
      if (v < y0 - 1e-9 || v > y1 + 1e-9) continue;
      const y = o.logy ? Y(Math.pow(10, v)) : Y(v);
      s("line", {x1: m.l, x2: W - m.r, y1: y, y2: y, class: "grid"}, axes);
      s("text", {x: m.l - 6, y: y + 4, "text-anchor": "end", class: "tick"}, axes,
        o.logy ? fmt(Math.pow(10, v), 2) : fmt(v, 4));
    }
    if (o.xcats) {
      o.xcats.forEach((label, i) => {
        const x = X(i);
        s("line", {x1: x, x2: x, y1: H - m.b, y2: H - m.b + 4, class: "axis"}, axes);
        s("text", {x: x, y: H - m.b + 10, "text-anchor": "end", class: "tick",
                   transform: `rotate(-40 ${x} ${H - m.b + 10})`}, axes, clip(label, 22));
      });
    } else {
      const whole = xs.every(Number.isInteger);  // steps, distances: no tick between two of them
      for (const v of niceTicks(x0, x1, 5)) {
        if (v < x0 || v > x1 || (whole && !Number.isInteger(v))) continue;
        s("line", {x1: X(v), x2: X(v), y1: H - m.b, y2: H - m.b + 4, class: "axis"}, axes);
        s("text", {x: X(v), y: H - m.b + 16, "text-anchor": "middle", class: "tick"}, axes, fmt(v, 6));
      }
    }
    s("line", {x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b, class: "axis"}, axes);
    s("line", {x1: m.l, x2: m.l, y1: m.t, y2: H - m.b, class: "axis"}, axes);
    if (o.xlabel) s("text", {x: (m.l + W - m.r) / 2, y: H - 6, "text-anchor": "middle", class: "axis-title"}, axes, o.xlabel);
    s("text", {x: 14, y: (m.t + H - m.b) / 2, "text-anchor": "middle", class: "axis-title",
               transform: `rotate(-90 14 ${(m.t + H - m.b) / 2})`}, axes, o.ylabel + (o.logy ? " (log scale)" : ""));
    for (const line of o.series) {
      const pts = line.xs.map((x, i) => [x, line.ys[i]]).filter(([, y]) => y !== null && Number.isFinite(y) && (!o.logy || y > 0));
      if (line.line !== false && pts.length > 1) {
        s("polyline", {points: pts.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(" "), fill: "none",
                       stroke: line.colour, "stroke-width": line.width || 1.6, "stroke-opacity": line.opacity || 1}, svg);
      }
      if (line.marker) {
        const dots = s("g", {}, svg);
        pts.forEach(([x, y], i) => {
          const dot = s("circle", {cx: X(x), cy: Y(y), r: 3.2, fill: line.colour}, dots);
          dot.dataset.tip = `${line.name}: ${o.xcats ? o.xcats[x] : (o.xlabel || "x") + " " + fmt(x, 6)}: ${fmt(y, 4)}`;
        });
        tipOn(dots, (target) => target.dataset && target.dataset.tip);
      }
    }
    return figure;
  }

  // ------------------------------------------------------------------ the page
  function header() {
    h("h1", {}, page, DATA.title);
    const model = DATA.model || {};
    if (model.facts && model.facts.length) {
      const facts = h("dl", {class: "facts"}, page);
      for (const [key, value] of model.facts) { h("dt", {}, facts, key); h("dd", {}, facts, value); }
    }
    for (const warning of DATA.warnings || []) h("p", {class: "box warning", role: "status"}, page, warning);
    if (DATA.error) h("p", {class: "error", role: "alert", id: "error"}, page, DATA.error);
    if (DATA.serve) serveForm(DATA.serve);
    const nav = h("nav", {}, page);
    const sparse = model.sparse ? [["experts", "Experts"]] : [];  // a mixture of experts' sections
    for (const [id, name] of [["tokens", "Tokens and predictions"], ["attention", "Attention"], ...sparse,
                              ["backward", "Backward pass"], ["training", "Training curves"],
                              ...(model.sparse ? [["expert-load", "Expert load"]] : [])]) {
      h("a", {href: "#" + id}, nav, name);
    }
    if ((DATA.examples || []).length > 1) {
      h("label", {for: "example-select"}, nav, "sentence");
      const select = h("select", {id: "example-select"}, nav);
      DATA.examples.forEach((ex, i) => h("option", {value: i}, select, `${i + 1}: ${clip(ex.text, 60)}`));
      select.addEventListener("change", () => drawExample(Number(select.value)));
    }
  }

  function serveForm(serve) {
    const form = h("form", {method: "get", action: "/", class: "box", id: "ask"}, page);
    h("label", {for: "text"}, form, DATA.model.text_label);
    const text = h("input", {type: "text", name: "text", id: "text", maxlength: serve.max_chars, required: "",
                             placeholder: `at most ${serve.max_chars} characters`}, form);
    text.value = serve.text || "";
    if (serve.reference) {
      h("br", {}, form);
      h("label", {for: "reference"}, form, "reference (optional)");
      const ref = h("input", {type: "text", name: "reference", id: "reference", maxlength: serve.max_chars,
                              placeholder: "else the model's own translation is scored"}, form);
      ref.value = serve.reference_text || "";
    }
    h("button", {type: "submit"}, form, "inspect");
    h("p", {class: "caption"}, form, "Computed by the model this server loaded once; the page is redrawn for each sentence.");
  }

  function section(id, title, parent) {
    const box = h("section", {id: id}, parent);
    h("h2", {}, box, title);
    return box;
  }

  // ------------------------------------------------------------------ tokens and predictions
  function chips(parent, pieces, cls) {
    const row = h("div", {class: "tokens"}, parent);
    return pieces.map((piece) => h("span", {class: "token " + (cls || "")}, row, show(piece)));
  }

  function tokensSection(ex, parent) {
    const box = section("tokens", "Tokens and predictions", parent);
    const gpt = ex.source === null, enc = ex.masked === true;  // enc: an encoder's text, scored at its masks
    h("p", {class: "caption"}, box, enc
      ? "The text as the encoder reads it (its tokenizer's pieces, with its special tokens). Every position reads " +
        "every other (attention in both directions); only the masks are scored, " + ex.target_from + ". Hover " +
        "over a mask (or click it, or tab to it) to see its five most likely tokens, the candidates for it."
      : gpt
      ? "The text as the model reads it (its tokenizer's pieces). Token t is predicted from tokens 0 … t−1, so " +
        "each token's colour is the probability the model gave it before seeing it; the first token has nothing " +
        "before it. Hover over a token (or click it, or tab to it) to see the five tokens the model found most " +
        "likely at that place; the last chip shows what it expects after the text."
      : "The source as the encoder reads it (sentencepiece pieces: ▁ starts a word, </s> ends the sentence), and " +
        "the target the decoder is scored on, teacher-forced: " + ex.target_from + ". Each target token's colour " +
        "is the probability the model gave it at its place; hover over a target token (or click it, or tab to it) " +
        "to see the five tokens the model found most likely there.");
    if (ex.reference !== null && ex.reference !== undefined) h("p", {}, box, "reference: " + ex.reference);
    if (!gpt) {
      h("div", {class: "row-label"}, box, `source: ${ex.source.length} pieces`);
      chips(box, ex.source, "source");
    }
    h("div", {class: "row-label"}, box, gpt ? `text: ${ex.input.length} tokens` :
      `target: ${ex.predicted.length} pieces, each predicted from the source and the target pieces before it`);
    const row = h("div", {class: "tokens", id: "targets"}, box);
    // each chip: [text, the position whose prediction it shows (or -1), whether it is the scored token]
    const items = enc ? ex.input.map((p, i) => [p, ex.predicted[i] === null ? -2 : i])
      : gpt ? [[ex.input[0], -1]].concat(ex.input.slice(1).map((p, i) => [p, i]), [["next?", ex.input.length - 1]])
      : ex.predicted.map((p, i) => [p, i]);
    const panel = h("div", {class: "box", id: "alternatives", "aria-live": "polite"}, null);
    let pinned = null;
    items.forEach(([piece, position], k) => {
      if (position === -2) {  // an encoder's position that is not masked: no loss there
        h("span", {class: "token none", title: "not masked: the loss reads no prediction here"}, row, show(piece));
        return;
      }
      if (position < 0) {
        const chip = h("span", {class: "token none", title: "the first token: nothing before it predicts it"}, row, show(piece));
        h("small", {}, chip, "first");
        return;
      }
      const p = ex.probability[position], next = gpt && !enc && k === items.length - 1;
      const chip = h("span", {class: "token target" + (next ? " none" : ""), tabindex: 0, "data-position": position}, row,
                     next ? "next?" : enc ? show(piece) + " → " + show(ex.predicted[position]) : show(piece));
      if (!next) {
        chip.style.background = colour(GREENS, p);
        chip.style.color = darkOn(p) ? "#fff" : "#1b1f24";
        h("small", {}, chip, ex.probability_text[position]);  // 3 digits; never "1" below 1 (page.probability_text)
      } else {
        h("small", {}, chip, "after the text");
      }
      const open = () => alternatives(panel, ex, position, gpt, next);
      chip.addEventListener("mouseenter", open);
      chip.addEventListener("focus", open);
      chip.addEventListener("mouseleave", () => { if (pinned !== null) alternatives(panel, ex, pinned[0], gpt, pinned[1]); });
      chip.addEventListener("click", () => {
        row.querySelectorAll(".pinned").forEach((c) => c.classList.remove("pinned"));
        chip.classList.add("pinned");
        pinned = [position, next];
        open();
      });
    });
    gradientLegend(box, GREENS, "0", "1", "probability the model gave the shown token");
    box.appendChild(panel);
    h("p", {class: "muted"}, panel, "Hover over a " + (enc ? "mask" : gpt ? "token" : "target token") + " to see the alternatives the model weighed there.");
    const ppl = Math.exp(ex.loss);
    h("p", {id: "loss"}, box, `loss: ${fmt(ex.loss, 4)}, the cross-entropy of the ${enc ? "masks' top candidates" : gpt ? "text's next tokens" : "shown target"}` +
      `${ex.smoothing ? " (label smoothing " + ex.smoothing + ")" : " (no label smoothing)"}, mean over its ${ex.num_tokens} ` +
      `scored token${ex.num_tokens === 1 ? "" : "s"} (perplexity ${fmt(ppl, 4)}).`);
  }

  function alternatives(panel, ex, position, gpt, next) {
    panel.textContent = "";
    const wanted = ex.predicted[position];
    const context = ex.masked === true ? ex.input.map(show).join(" ")
      : gpt ? ex.input.slice(Math.max(0, position - 5), position + 1).map(show).join("")
      : ex.input.slice(Math.max(0, position - 5), position + 1).map(show).join(" ");
    const title = next ? `After the whole text, the model expects next:`
      : ex.masked === true ? `Position ${position} of “${context}”: the model's five most likely tokens for this mask ` +
        `(the first, “${show(wanted)}”, probability ${ex.probability_text[position]}, is the one scored):`
      : `Position ${position}: after “…${context}” the model gave “${show(wanted)}” probability ${ex.probability_text[position]}.` +
        " Its five most likely tokens here:";
    h("p", {}, panel, title);
    const table = h("table", {class: "alts"}, panel);
    ex.top[position].forEach(([piece, p], k) => {
      const tr = h("tr", {class: piece === wanted ? "chosen" : ""}, table);
      h("td", {class: "piece"}, tr, show(piece));
      const bar = h("div", {class: "bar"}, h("td", {}, tr));
      bar.style.width = Math.max(1, Math.round(220 * p)) + "px";
      h("td", {}, tr, ex.top_text[position][k] + (piece === wanted ? "  (the shown token)" : ""));
    });
    if (!next && !ex.top[position].some(([piece]) => piece === wanted)) {
      h("p", {class: "muted"}, panel, `The shown token “${show(wanted)}” is not among them.`);
    }
  }

  // ------------------------------------------------------------------ attention
  const KIND_CAPTIONS = {
    "encoder self-attention": "Rows: the source tokens as queries; columns: the source tokens as keys.",
    "decoder masked self-attention": "Rows: the decoder's positions, labelled by the token each reads (left) and " +
      "the token it predicts (right, after →); columns: the target tokens read at the same or earlier positions. " +
      "Grey cells are masked: a position cannot look at later ones.",
    "cross-attention": "Rows: the decoder's positions, labelled by the token each reads (left) and the token it " +
      "predicts (right, after →); columns: the source tokens (keys and values come from the encoder's output). " +
      "In a trained model, the row that predicts a target word often weighs the source word it translates.",
    "self-attention (both directions)": "Rows: the positions as queries, labelled by the token each reads " +
      "(left) and, at a mask, the token the model puts there (right, after →); columns: every token of the text " +
      "as keys. Nothing is masked: each position reads the tokens before and after it.",
    "causal self-attention": "Rows: the positions, labelled by the token each reads (left) and the token it " +
      "predicts (right, after →); columns: the tokens read at the same or earlier positions. Grey cells are " +
      "masked: a position cannot look at later ones.",
  };

  function attentionSection(ex, parent) {
    const box = section("attention", "Attention", parent);
    const biased = ex.position_bias && ex.position_bias.length;  // T5: unscaled scores plus a position bias
    h("p", {class: "caption"}, box, "Each cell is an attention weight that minitf's attention computed for this " +
      "input, " + (biased ? "P = softmax(Q Kᵀ + B) (T5's: no 1/√dk, B the position bias charted below)"
        : "P = softmax(Q Kᵀ / √dk)") + " (minitf/attention.py): how much the row's position takes from the " +
      "column's " +
      "position; each row sums to 1. Choose the attention, the layer (0 is the one nearest the input) and the " +
      "head; “all heads” shows every head of the layer side by side.");
    const controls = h("div", {class: "controls"}, box);
    const kinds = ex.attention;
    h("label", {for: "attn-kind"}, controls, "attention");
    const kind = h("select", {id: "attn-kind"}, controls);
    kinds.forEach((a, i) => h("option", {value: i}, kind, a.name));
    h("label", {for: "attn-layer"}, controls, "layer");
    const layer = h("select", {id: "attn-layer"}, controls);
    h("label", {for: "attn-head"}, controls, "head");
    const head = h("select", {id: "attn-head"}, controls);
    h("label", {for: "attn-scale"}, controls, "colours");
    const scale = h("select", {id: "attn-scale"}, controls);
    h("option", {value: "1"}, scale, "0 to 1");
    h("option", {value: "max"}, scale, "0 to the map's largest weight");
    const area = h("div", {id: "heatmap-area"}, box);
    const weights = kinds.map(floats);
    function fill(select, n, extra, labels) {
      const keep = select.value;
      select.textContent = "";
      for (let i = 0; i < n; i++) h("option", {value: i}, select, labels ? labels[i] : String(i));
      if (extra) h("option", {value: "all"}, select, extra);
      if ([...select.options].some((o) => o.value === keep)) select.value = keep;
    }
    function draw() {
      const a = kinds[Number(kind.value)], [L, H] = a.shape;
      fill(layer, L);
      fill(head, H, "all heads", a.heads && a.heads.map((label) => label.replace(/^head /, "")));
      area.textContent = "";
      drawHeatmaps(area, ex, a, weights[Number(kind.value)], Number(layer.value), head.value, scale.value, (h_) => {
        head.value = String(h_);
        draw();
      });
    }
    kind.addEventListener("change", draw);
    layer.addEventListener("change", draw);
    head.addEventListener("change", draw);
    scale.addEventListener("change", draw);
    draw();
    if (ex.position_bias && ex.position_bias.length) positionBiasCharts(ex, box);
  }

  // ------------------------------------------------------------------ a relative position bias (T5)
  const HEAD_COLOURS = ["#0969da", "#cf222e", "#1a7f37", "#bf8700", "#8250df", "#d2691e", "#1b7c83", "#6e7781"];
  function positionBiasCharts(ex, parent) {
    h("p", {class: "caption", id: "position-bias-caption"}, parent, "The relative position bias B that this " +
      "model's attention adds to each score (minitf/attention.py RelativePositionBias), every layer of a stack the " +
      "same B. Each line is one head's bias by distance (key " +
      "position − query position), read from the stack's table through its bucket function: one bucket per " +
      "distance near 0, logarithmic buckets further out, one bucket for every distance from the table's largest " +
      "on. The encoder reads both directions; the decoder only the past (distances ≤ 0).");
    const charts = h("div", {class: "charts"}, parent);
    ex.position_bias.forEach((bias, i) => {
      lineChart(charts, {
        id: "position-bias-" + i, title: "Position bias: " + bias.name, xlabel: "key position − query position",
        ylabel: "bias added to the score",
        series: bias.values.map((ys, hd) => ({name: "head " + hd, xs: bias.distances, ys: ys,
                                              colour: HEAD_COLOURS[hd % HEAD_COLOURS.length]})),
      });
    });
  }

  // a head's name: "head 3", or its kind's label ("head 3 (key/value head 1)": grouped-query attention)
  function headLabel(a, hd) {
    return a.heads ? a.heads[hd] : `head ${hd}`;
  }

  function drawHeatmaps(area, ex, a, values, layer, head, scale, choose) {
    const [, H, Tq, Tk] = a.shape;
    const rows = ex[a.rows], cols = ex[a.cols];
    const predicted = a.rows === "input" ? ex.predicted : null;
    const at = (hd, i, j) => values[((layer * H + hd) * Tq + i) * Tk + j];
    // the colour of a weight: 0 to 1, or stretched to the largest weight of the map(s) shown
    let top = 1;
    if (scale === "max") {
      top = 0;
      for (let hd = 0; hd < H; hd++) if (head === "all" || hd === Number(head)) {
        for (let i = 0; i < Tq * Tk; i++) top = Math.max(top, values[(layer * H + hd) * Tq * Tk + i]);
      }
      top = top || 1;
    }
    if (head === "all") {
      h("h3", {}, area, `${a.name}, layer ${layer}: all ${H} heads`);
      h("p", {class: "caption"}, area, KIND_CAPTIONS[a.name] + " Click a head to see it large, with its tokens.");
      const grid = h("div", {class: "heads"}, area);
      for (let hd = 0; hd < H; hd++) {
        const figure = h("figure", {"data-head": hd}, grid);
        heatmap(figure, a, rows, cols, predicted, (i, j) => at(hd, i, j), {small: true, layer: layer, head: hd, top: top});
        h("figcaption", {}, figure, headLabel(a, hd));
        figure.addEventListener("click", () => choose(hd));
      }
      gradientLegend(area, BLUES, "0", fmt(top, 3), "attention weight" + (top < 1 ? " (colours stretched to the largest weight shown)" : ""));
      return;
    }
    const hd = Number(head);
    h("h3", {}, area, `${a.name}, layer ${layer}, ${headLabel(a, hd)}`);
    h("p", {class: "caption"}, area, KIND_CAPTIONS[a.name]);
    heatmap(area, a, rows, cols, predicted, (i, j) => at(hd, i, j), {layer: layer, head: hd, top: top});
    gradientLegend(area, BLUES, "0", fmt(top, 3), "attention weight" + (top < 1 ? " (colours stretched to this map's largest weight)" : ""));
  }

  function heatmap(parent, a, rows, cols, predicted, value, o) {
    const Tq = rows.length, Tk = cols.length;
    const small = !!o.small;
    const cell = small ? Math.max(2, Math.min(12, Math.floor(176 / Math.max(Tq, Tk))))
      : Math.max(12, Math.min(30, Math.floor(Math.min(640 / Tk, 760 / Tq))));  // readable labels, even if long
    const font = Math.min(12, Math.max(9, cell - 3));
    const longest = (labels) => Math.max(1, ...labels.map((l) => show(l).length));
    const left = small ? 2 : Math.min(150, 8 + 0.62 * font * Math.min(18, longest(rows)));
    const right = small || !predicted ? 2 : Math.min(160, 22 + 0.62 * font * Math.min(18, longest(predicted.map((p) => p === null ? "" : p))));
    const top = small ? 2 : Math.min(140, 10 + 0.62 * font * Math.min(18, longest(cols)));
    const W = left + Tk * cell + right, Hh = top + Tq * cell + 2;
    const svg = s("svg", {class: "chart heatmap", viewBox: `0 0 ${W} ${Hh}`, width: W, height: Hh, role: "img",
                          "aria-label": `${a.name}, layer ${o.layer}, head ${o.head}`,
                          "data-kind": a.name, "data-layer": o.layer, "data-head": o.head}, parent);
    if (!small) svg.id = "heatmap";
    const cells = s("g", {}, svg);
    const shown = [];
    for (let i = 0; i < Tq; i++) {
      for (let j = 0; j < Tk; j++) {
        const v = value(i, j), masked = a.causal && j > i;
        s("rect", {x: left + j * cell, y: top + i * cell, width: cell, height: cell, "data-i": i, "data-j": j,
                   fill: masked ? "#d8dee4" : colour(BLUES, v / o.top), stroke: small ? "none" : "#fff", "stroke-width": 0.5}, cells);
        shown.push(v);
      }
    }
    svg.dataset.values = shown.map((v) => v.toFixed(4)).join(" ");
    if (!small) {
      rows.forEach((label, i) => s("text", {x: left - 4, y: top + i * cell + cell / 2 + font / 3, "text-anchor": "end",
                                             class: "mono", "font-size": font}, svg, clip(show(label), 18)));
      if (predicted) {
        predicted.forEach((label, i) => s("text", {x: left + Tk * cell + 4, y: top + i * cell + cell / 2 + font / 3,
                                                   class: "mono", "font-size": font, fill: "#57606a"}, svg,
                                          label === null ? "→ (nothing)" : "→ " + clip(show(label), 18)));
      }
      cols.forEach((label, j) => {
        const x = left + j * cell + cell / 2 + font / 3, y = top - 4;
        s("text", {x: x, y: y, transform: `rotate(-60 ${x} ${y})`, class: "mono", "font-size": font}, svg, clip(show(label), 18));
      });
      tipOn(cells, (target) => {
        if (!target.dataset || target.dataset.i === undefined) return null;
        const i = Number(target.dataset.i), j = Number(target.dataset.j);
        if (a.causal && j > i) return `masked: position ${i} cannot look at the later position ${j}`;
        return `row ${i} ${show(rows[i])}${predicted && predicted[i] !== null ? " (→ " + show(predicted[i]) + ")" : ""}` +
          ` takes ${fmt(value(i, j), 3)} from column ${j} ${show(cols[j])}`;
      });
    }
    return svg;
  }

  // ------------------------------------------------------------------ the experts (a mixture of experts)
  // one hue per expert, neighbours far apart on the wheel (the golden angle): a cell's colour, a load line's
  const expertHue = (e) => Math.round((e * 137.508) % 360);
  const expertColour = (e) => `hsl(${expertHue(e)}, 65%, 40%)`;
  const expertTint = (e) => `hsl(${expertHue(e)}, 70%, 90%)`;
  //: the most experts the router panel lists one by one (the rest summed in one line)
  const ROUTER_ROWS = 16;

  function expertsSection(ex, parent) {
    const r = ex.experts, E = r.num_experts, k = r.top_k, T = ex.input.length, layers = r.layers;
    const weights = floats(r.weights), probs = floats(r.probs);  // (layers, T, k), (layers, T, E)
    const box = section("experts", "Experts", parent);
    h("p", {class: "caption"}, box, `Each sparse feed-forward's router (minitf.moe.SparseMoE) sends each token to ` +
      `${k} of its ${E} experts: p = softmax(x W_router) over all ${E}, the ${k} most probable kept, and the ` +
      "token's output is the sum of their outputs, each times its weight (p renormalised over the chosen ones, " +
      "or p itself where the model does not renormalise)" + (r.shared ? "; a shared expert reads every token too, " +
      "behind its sigmoid gate" : "") + ". Rows: the tokens; columns: the sparse layers (0 is the block nearest " +
      "the input). Each cell lists the chosen experts, first choice first, with their weights, in the colour of " +
      "the first. Hover over a cell (or click it, or tab to it) for the router's probability of every expert there.");
    const wrap = h("div", {class: "scroll"}, box);
    const table = h("table", {class: "routes", id: "expert-grid"}, wrap);
    const head = h("tr", {}, h("thead", {}, table));
    h("th", {}, head, "position");
    h("th", {}, head, "token");
    for (const l of layers) h("th", {}, head, `layer ${l}`);
    const body = h("tbody", {}, table);
    const panel = h("div", {class: "box", id: "router-panel", "aria-live": "polite"}, null);
    let pinned = null;
    for (let t = 0; t < T; t++) {
      const tr = h("tr", {}, body);
      h("td", {class: "muted"}, tr, String(t));
      h("td", {class: "piece"}, tr, show(ex.input[t]));
      layers.forEach((l, i) => {
        const chosen = r.idx[i][t];
        const td = h("td", {class: "route", tabindex: 0, "data-layer": l, "data-position": t,
                            "data-experts": chosen.join(" ")}, tr);
        td.style.background = expertTint(chosen[0]);
        chosen.forEach((e, j) => {
          const w = weights[(i * T + t) * k + j];
          const item = h("span", {class: "choice"}, td, `${e} `);
          item.style.color = expertColour(e);
          h("small", {}, item, fmt(w, 2));
        });
        const open = () => routerPanel(panel, ex, i, t, probs, weights);
        td.addEventListener("mouseenter", open);
        td.addEventListener("focus", open);
        td.addEventListener("mouseleave", () => { if (pinned !== null) routerPanel(panel, ex, pinned[0], pinned[1], probs, weights); });
        td.addEventListener("click", () => {
          table.querySelectorAll(".pinned").forEach((c) => c.classList.remove("pinned"));
          td.classList.add("pinned");
          pinned = [i, t];
          open();
        });
      });
    }
    // this text's load: the tokens each expert got in each layer (every slot counted: they sum to k per token)
    const foot = h("tr", {}, h("tfoot", {}, table));
    h("td", {colspan: 2, class: "muted"}, foot, "tokens per expert");
    layers.forEach((l, i) => {
      const counts = new Array(E).fill(0);
      for (let t = 0; t < T; t++) for (const e of r.idx[i][t]) counts[e] += 1;
      const td = h("td", {class: "load", "data-layer": l, "data-counts": counts.join(" ")}, foot);
      counts.forEach((n, e) => { if (n) { const c = h("span", {class: "choice"}, td, `${e}: ${n} `); c.style.color = expertColour(e); } });
    });
    box.appendChild(panel);
    h("p", {class: "muted"}, panel, "Hover over a cell to see the router's probabilities there.");
  }

  function routerPanel(panel, ex, i, t, probs, weights) {
    const r = ex.experts, E = r.num_experts, k = r.top_k, T = ex.input.length, chosen = r.idx[i][t];
    panel.textContent = "";
    h("p", {}, panel, `Position ${t} “${show(ex.input[t])}”, layer ${r.layers[i]}: the router's probability of ` +
      `each of its ${E} experts, most probable first; the ${k} chosen in bold, with the weight of their output.`);
    const p = Array.from({length: E}, (_, e) => [e, probs[(i * T + t) * E + e]]).sort((a, b) => b[1] - a[1]);
    const table = h("table", {class: "alts", id: "router-table"}, panel);
    p.slice(0, ROUTER_ROWS).forEach(([e, pe]) => {
      const j = chosen.indexOf(e);
      const tr = h("tr", {class: j >= 0 ? "chosen" : "", "data-expert": e}, table);
      h("td", {class: "piece"}, tr, `expert ${e}`);
      const bar = h("div", {class: "bar"}, h("td", {}, tr));
      bar.style.width = Math.max(1, Math.round(220 * pe)) + "px";
      bar.style.background = expertColour(e);
      h("td", {}, tr, fmt(pe, 3) + (j >= 0 ? `  (chosen, weight ${fmt(weights[(i * T + t) * k + j], 3)})` : ""));
    });
    if (E > ROUTER_ROWS) {
      const rest = p.slice(ROUTER_ROWS);
      h("p", {class: "muted"}, panel, `The other ${rest.length} experts: at most ${fmt(rest[0][1], 3)} each, ` +
        `${fmt(rest.reduce((sum, [, pe]) => sum + pe, 0), 3)} together.`);
    }
  }

  function expertLoadSection(parent) {
    const box = section("expert-load", "Expert load over training", parent);
    const load = DATA.expert_load;
    if (!load) {
      h("p", {class: "muted", id: "no-expert-load"}, box, DATA.expert_load_note || "No expert load for this model.");
      return;
    }
    const E = load.num_experts;
    h("p", {class: "caption"}, box, `From the run's metrics.jsonl (${load.path}): each training step's ` +
      "expert_load, the tokens each expert got in each sparse layer (every token counted once per chosen expert), " +
      "drawn as each expert's share of the layer's choices" + (load.stride > 1 ? `, summed over runs of ${load.stride} ` +
      "steps (each point ends its run)" : "") + `. A balanced layer gives each expert 1/${E}; a router collapsing ` +
      "onto a few experts shows their lines rising and the others' falling to 0.");
    const controls = h("div", {class: "controls"}, box);
    h("label", {for: "load-layer"}, controls, "sparse layer");
    const select = h("select", {id: "load-layer"}, controls);
    load.layers.forEach((l, i) => h("option", {value: i}, select, String(l)));
    const area = h("div", {class: "charts", id: "load-area"}, box);
    function draw() {
      const i = Number(select.value), counts = load.counts[i];
      area.textContent = "";
      const shares = counts.map((row) => { const n = row.reduce((a, b) => a + b, 0); return row.map((c) => n ? c / n : null); });
      const series = Array.from({length: E}, (_, e) => ({name: `expert ${e}`, xs: load.step,
                                                         ys: shares.map((row) => row[e]), colour: expertColour(e)}));
      series.push({name: `balanced, 1/${E}`, xs: load.step, ys: load.step.map(() => 1 / E), colour: "#8c959f", width: 1});
      const figure = lineChart(area, {id: "expert-load", title: `Layer ${load.layers[i]}: each expert's share of the layer's choices`,
                                      xlabel: "step", ylabel: "share of the layer's choices", series: series, zero: true,
                                      width: 620});
      figure.dataset.layer = String(load.layers[i]);
      figure.dataset.shares = shares.map((row) => row.map((v) => fmt(v, 4)).join(" ")).join(";");
    }
    select.addEventListener("change", draw);
    draw();
  }

  // ------------------------------------------------------------------ the backward pass
  const KIND_COLOURS = {loss: "#cf222e", stream: "#0969da", branch: "#8c959f", weight: "#bf8700"};
  // the legend of the walk's bars; a block's norm is the model's own (LayerNorm or the Llama's RMSNorm)
  const kindNames = (norm) => ({loss: "dL/dlogits", stream: "the residual stream (between blocks, the stacks' ends, the memory)",
                                branch: `inside a block (${norm}′, a sublayer's backward)`, weight: "a weight matrix's gradient"});
  const normOf = (model) => (model.layout || "").includes("RMSNorm") ? "RMSNorm" : "LayerNorm";

  function backwardSection(ex, parent, model) {
    const box = section("backward", "Backward pass", parent);
    const gpt = ex.source === null;
    const norm = normOf(model);
    h("p", {class: "caption"}, box, `One backward of the loss above (${fmt(ex.loss, 4)}), by the model's own ` +
      "backward passes; each number is the Euclidean norm of a gradient array over all its positions. " +
      (model.layout !== "post-LN"   // pre-LN, or the Llama's pre-norm RMSNorm: the same shape of backward
        ? `This model is ${model.layout}: in each block dx = dy + N′(dh) (N its ${norm}), the skip connection ` +
          `passes dy down unchanged and the sublayer adds its share, so no ${norm} stands between a layer's ` +
          `output and its input; only each stack's final ${norm} rescales the gradient, once, at the top of the ` +
          "stack."
        : "This model is post-LN: in each block dx = LN′(dy) + Sublayer′(LN′(dy)), the LayerNorm's backward " +
          "rescales the gradient before it splits into the skip and the sublayer, once per block, so its size " +
          "can shrink or grow from block to block.") +
      " (docs/layers/residual.md compares the two; docs/walk.md follows one gradient step by step.)");
    const charts = h("div", {class: "charts"}, box);
    lineChart(charts, {
      id: "points", title: "The gradient down the residual stream",
      caption: `|dL/dx| at the ${ex.masked === true ? "encoder" : "decoder"}'s output, at each layer's input (the top layer first)` +
        (gpt ? ", down to the embeddings." : ", at the encoder's output (the memory: its gradient sums the " +
          "cross-attention of every decoder layer) and at each encoder layer's input.") +
        (ex.points_note ? " " + ex.points_note : ""),
      xcats: ex.points.map(([name]) => name), ylabel: "gradient norm", logy: true,
      // one line per stack (ex.point_lines): nothing joins the decoder's layer 0 to the encoder's output
      series: ex.point_lines.map(([first, last], k) => {
        const xs = [];
        for (let i = first; i <= last; i++) xs.push(i);
        const stack = ex.point_lines.length === 1 ? "" : (k === 0 ? "decoder: " : "encoder: ");
        return {name: stack + "|dL/d(residual stream)|", xs: xs, ys: xs.map((i) => ex.points[i][1]),
                colour: k === 0 ? KIND_COLOURS.stream : "#1a7f37", marker: true};
      }),
      width: Math.max(420, 60 * ex.points.length + 120), height: 330,
    });
    embeddingChart(charts, ex);
    walkChart(box, ex, model);
  }

  function embeddingChart(parent, ex) {
    const gpt = ex.source === null, tokens = gpt ? ex.input : ex.source, norms = ex.embedding_grad.norms;
    const figure = h("figure", {"data-chart": "embedding"}, parent);
    h("h3", {}, figure, gpt ? "Which tokens the loss is most sensitive to" : "Which source tokens the loss is most sensitive to");
    h("p", {class: "caption"}, figure, "|dL/d(embedding row)| at each " + (gpt ? "position" : "source position") +
      ": the gradient Embedding.backward adds into the embedding row of the token read there (dy times the " +
      "embedding's scale: √d_model where the model scales its embeddings, as the paper's does, else 1). A taller bar: a small change of that token's vector moves the loss more." +
      (ex.embedding_grad.note ? " " + ex.embedding_grad.note : ""));
    const bar = Math.max(10, Math.min(36, Math.floor(560 / tokens.length)));
    const m = {l: 70, r: 10, t: 10, b: 90}, W = m.l + bar * tokens.length + m.r, H = 300;
    const svg = s("svg", {class: "chart", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
                          "aria-label": "embedding gradient norm per token", id: "embedding-chart"}, figure);
    const top = Math.max(...norms) || 1, ticks = niceTicks(0, top, 4);
    const ymax = Math.max(top, ticks[ticks.length - 1]);
    const Y = (v) => H - m.b - v / ymax * (H - m.t - m.b);
    for (const v of ticks) {
      s("line", {x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v), class: "grid"}, svg);
      s("text", {x: m.l - 6, y: Y(v) + 4, "text-anchor": "end", class: "tick"}, svg, fmt(v, 3));
    }
    const bars = s("g", {}, svg);
    tokens.forEach((token, i) => {
      const x = m.l + i * bar;
      const rect = s("rect", {x: x + 1, y: Y(norms[i]), width: bar - 2, height: Y(0) - Y(norms[i]), fill: KIND_COLOURS.stream}, bars);
      rect.dataset.tip = `${show(token)}: ${fmt(norms[i], 4)}`;
      s("text", {x: x + bar / 2 + 4, y: H - m.b + 8, "text-anchor": "end", class: "mono",
                 transform: `rotate(-60 ${x + bar / 2 + 4} ${H - m.b + 8})`}, svg, clip(show(token), 14));
    });
    tipOn(bars, (target) => target.dataset && target.dataset.tip);
    s("line", {x1: m.l, x2: W - m.r, y1: Y(0), y2: Y(0), class: "axis"}, svg);
    s("text", {x: 14, y: (m.t + H - m.b) / 2, "text-anchor": "middle", class: "axis-title",
               transform: `rotate(-90 14 ${(m.t + H - m.b) / 2})`}, svg, "gradient norm");
  }

  function walkChart(parent, ex, model) {
    const figure = h("figure", {"data-chart": "walk"}, parent);
    const norm = normOf(model);
    h("h3", {}, figure, "Every step of the walk, from dL/dlogits down to the embeddings");
    h("p", {class: "caption"}, figure, (model.walk_command
      ? `The steps that ${model.walk_command} prints for its one-layer example, here for every layer of this model, `
      : "The steps of this model's backward, for every layer (python -m minitf.trace --checkpoint PATH --text TEXT " +
        "records each call), ") + "in the order the backward runs them" +
      (norm === "LayerNorm" ? " (the names are those of SublayerConnection.backward: dx_skip, dh, dx)" : "") +
      ". The bar is the norm of the gradient on a log scale; hover for its shape.");
    const legend = h("div", {class: "legend"}, figure);
    for (const [kind, name] of Object.entries(kindNames(norm))) {
      const sw = h("span", {class: "swatch"}, legend);
      sw.style.background = KIND_COLOURS[kind];
      h("span", {}, legend, name + "  ");
    }
    const steps = ex.walk, row = 17, labelW = 650, barW = 320, m = {t: 44, b: 8};
    const norms = steps.filter((st) => st.norm !== undefined && st.norm > 0).map((st) => st.norm);
    const lo = Math.floor(Math.log10(Math.min(...norms))), hi = Math.ceil(Math.log10(Math.max(...norms)) + 1e-9);
    const span = Math.max(1, hi - lo);
    const X = (v) => labelW + (Math.log10(v) - lo) / span * barW;
    const W = labelW + barW + 90, H = m.t + steps.length * row + m.b;
    const svg = s("svg", {class: "chart", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
                          "aria-label": "gradient norm at each step of the walk", id: "walk-chart"}, figure);
    for (let p = lo; p <= lo + span; p++) {
      s("line", {x1: X(Math.pow(10, p)), x2: X(Math.pow(10, p)), y1: m.t - 4, y2: H - m.b, class: "grid"}, svg);
      s("text", {x: X(Math.pow(10, p)), y: m.t - 8, "text-anchor": "middle", class: "tick"}, svg, fmt(Math.pow(10, p), 1));
    }
    s("text", {x: labelW + barW / 2, y: 12, "text-anchor": "middle", class: "axis-title"}, svg, "gradient norm (log scale)");
    const bars = s("g", {}, svg);
    let number = 0;
    steps.forEach((st, i) => {
      const y = m.t + i * row;
      if (st.section !== undefined) {
        s("text", {x: 0, y: y + row - 4, class: "section"}, svg, "— " + st.section);
        return;
      }
      number += 1;
      s("text", {x: 4, y: y + row - 5, class: "mono"}, svg, clip(`${String(number).padStart(3)} ${st.label}`, 92));
      const rect = s("rect", {x: labelW, y: y + 3, width: st.norm > 0 ? Math.max(1, X(st.norm) - labelW) : 0,
                              height: row - 6, fill: KIND_COLOURS[st.kind]}, bars);
      rect.dataset.tip = `${number}. ${st.label}\nshape (${st.shape.join(", ")}), norm ${fmt(st.norm, 5)}`;
      s("text", {x: (st.norm > 0 ? X(st.norm) : labelW) + 4, y: y + row - 5, class: "tick"}, svg, fmt(st.norm, 3));
    });
    tipOn(bars, (target) => target.dataset && target.dataset.tip);
  }

  // ------------------------------------------------------------------ training curves
  function movingMean(ys, window) {
    const out = [];
    let sum = 0;
    for (let i = 0; i < ys.length; i++) {
      sum += ys[i];
      if (i >= window) sum -= ys[i - window];
      out.push(i >= window - 1 ? sum / window : null);
    }
    return out;
  }

  function trainingSection(parent) {
    const box = section("training", "Training curves", parent);
    const c = DATA.curves;
    if (!c) {
      h("p", {class: "muted", id: "no-curves"}, box, DATA.curves_note || "No training curves for this model.");
      return;
    }
    h("p", {class: "caption"}, box, `From the run's metrics.jsonl (${c.path}): one point per training step, and ` +
      "the validations the run made; the x axis is the Adam step.");
    const charts = h("div", {class: "charts"}, box);
    const window = Math.max(1, Math.min(50, Math.floor(c.train.step.length / 10)));
    const train = window > 1
      ? [{name: "training, per step", xs: c.train.step, ys: c.train.loss, colour: "#9ec5fe", width: 1},
         {name: `training, ${window}-step mean`, xs: c.train.step, ys: movingMean(c.train.loss, window), colour: "#0969da"}]
      : [{name: "training, per step", xs: c.train.step, ys: c.train.loss, colour: "#0969da"}];
    lineChart(charts, {
      id: "loss", title: "Loss", xlabel: "step", ylabel: c.loss_name,
      caption: window > 1 ? `Training loss of each step (light), its mean over ${window} steps, and validation loss.`
        : "Training loss of each step, and validation loss.",
      series: train.concat([{name: "validation", xs: c.valid.step, ys: c.valid.loss, colour: "#cf222e", marker: true}]),
    });
    if (c.valid.score && c.valid.score.some((v) => v !== null)) {
      lineChart(charts, {
        id: "score", title: c.score_name.charAt(0).toUpperCase() + c.score_name.slice(1), xlabel: "step", ylabel: c.score_name, caption: c.score_caption,
        series: [{name: "validation", xs: c.valid.step, ys: c.valid.score, colour: "#1a7f37", marker: true}],
        zero: c.score_name.startsWith("BLEU"),
      });
    }
    lineChart(charts, {
      id: "lr", title: "Learning rate", xlabel: "step", ylabel: "learning rate",
      caption: "The schedule's learning rate at each step (warmup, then decay).",
      series: [{name: "learning rate", xs: c.train.step, ys: c.train.lr, colour: "#8250df"}], zero: true,
    });
  }

  // ------------------------------------------------------------------ put together
  let exampleBox = null;
  function drawExample(index) {
    const ex = DATA.examples[index];
    exampleBox.textContent = "";
    if (ex.notes && ex.notes.length) for (const note of ex.notes) h("p", {class: "box warning"}, exampleBox, note);
    tokensSection(ex, exampleBox);
    attentionSection(ex, exampleBox);
    if (ex.experts) expertsSection(ex, exampleBox);
    backwardSection(ex, exampleBox, DATA.model || {});
  }

  header();
  exampleBox = h("div", {id: "example"}, page);
  if ((DATA.examples || []).length) drawExample(0);
  else if (!DATA.error) h("p", {class: "muted"}, exampleBox, "Type a sentence above to inspect it.");
  trainingSection(page);
  if ((DATA.model || {}).sparse) expertLoadSection(page);
  document.body.dataset.ready = "1";
})();
