// Parses every Mermaid file given with Mermaid's own parser (the one GitHub renders with), under jsdom.
// Exit 1, naming the file and the parser's message, if any does not parse.
import fs from "fs";
import { JSDOM } from "jsdom";

const dom = new JSDOM("<!doctype html><html><body></body></html>");
globalThis.window = dom.window;
globalThis.document = dom.window.document;
globalThis.DOMParser = dom.window.DOMParser;
globalThis.Element = dom.window.Element;
const { default: mermaid } = await import("mermaid");
mermaid.initialize({ startOnLoad: false });
let bad = 0;
for (const file of process.argv.slice(2)) {
  try {
    await mermaid.parse(fs.readFileSync(file, "utf8"));
  } catch (e) {
    bad++;
    console.error(`mermaid cannot parse ${file}: ${String(e.message || e).split("\n").slice(0, 4).join(" | ")}`);
  }
}
console.log(`mermaid: ${process.argv.length - 2 - bad} of ${process.argv.length - 2} files parse`);
process.exit(bad ? 1 : 0);
