// The guides (docs/guides/*.md) show code that must match the current API. Every ```ts block
// of a guide is type-checked against the sources, as one module per guide (blocks in page
// order, so a later block uses what an earlier one declared; `mooring` resolves to
// src/index.ts), with the repository's compiler options. Code that is not meant to compile
// (shell, QEMU command lines) uses another fence. Relative links of the guides and of the
// API overview must point at files (and headings or anchors) that exist, so a renamed class
// or member breaks this test rather than the reader's click.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../system/helpers/tools.js';

const guidesDir = join(repoRoot, 'docs', 'guides');
const guides = readdirSync(guidesDir).filter((f) => f.endsWith('.md') && f !== 'README.md').sort();

/** The guide as a TypeScript module: its ```ts blocks, every other line blank, so line numbers are the page's. */
function moduleOf(markdown: string): { code: string; blocks: number } {
  let inTs = false;
  let blocks = 0;
  const lines = markdown.split('\n').map((line) => {
    if (!inTs && /^```ts\s*$/.test(line)) {
      inTs = true;
      blocks++;
      return '';
    }
    if (inTs && /^```\s*$/.test(line)) {
      inTs = false;
      return '';
    }
    return inTs ? line : '';
  });
  return { code: lines.join('\n'), blocks };
}

/** Type errors of every guide, by guide file name. */
function typeCheck(): Map<string, string[]> {
  const config = ts.readConfigFile(join(repoRoot, 'tsconfig.json'), ts.sys.readFile);
  const parsed = ts.parseJsonConfigFileContent(config.config, ts.sys, repoRoot);
  const options: ts.CompilerOptions = {
    ...parsed.options,
    noEmit: true,
    // A guide may compute a value only to show it.
    noUnusedLocals: false,
    noUnusedParameters: false,
    baseUrl: repoRoot,
    paths: { mooring: ['src/index.ts'] },
  };
  const virtual = new Map(guides.map((g) => [join(guidesDir, `${g}.ts`), moduleOf(readFileSync(join(guidesDir, g), 'utf8')).code]));
  const host = ts.createCompilerHost(options);
  const { fileExists, readFile, getSourceFile } = host;
  host.fileExists = (f) => virtual.has(f) || fileExists.call(host, f);
  host.readFile = (f) => virtual.get(f) ?? readFile.call(host, f);
  host.getSourceFile = (f, lang, onError, create) => {
    const text = virtual.get(f);
    return text !== undefined ? ts.createSourceFile(f, text, lang, true) : getSourceFile.call(host, f, lang, onError, create);
  };
  const program = ts.createProgram([...virtual.keys()], options, host);
  const out = new Map<string, string[]>();
  for (const g of guides) {
    const sf = program.getSourceFile(join(guidesDir, `${g}.ts`))!;
    const diags = [...program.getSyntacticDiagnostics(sf), ...program.getSemanticDiagnostics(sf)];
    out.set(
      g,
      diags.map((d) => {
        const { line } = sf.getLineAndCharacterOfPosition(d.start ?? 0);
        return `docs/guides/${g}:${line + 1}: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`;
      }),
    );
  }
  return out;
}

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens. */
function slug(heading: string): string {
  const text = heading.replace(/\[([^\]]*)\]\([^)]*\)/g, '$1');
  return text.trim().toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, '').replace(/\s/g, '-');
}

/** The anchors a markdown page offers: its headings (numbered when repeated) and explicit ids. */
function anchorsOf(file: string): Set<string> {
  const out = new Set<string>();
  const seen = new Map<string, number>();
  let fence = false;
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    if (/^```/.test(line)) fence = !fence;
    if (fence) continue;
    const h = /^#{1,6}\s+(.*)$/.exec(line);
    if (h) {
      const s = slug(h[1]!);
      const n = seen.get(s) ?? 0;
      seen.set(s, n + 1);
      out.add(n === 0 ? s : `${s}-${n}`);
    }
    for (const m of line.matchAll(/\bid="([^"]+)"/g)) out.add(m[1]!);
  }
  return out;
}

/** Relative links of a page that lead nowhere. */
function brokenLinks(file: string): string[] {
  const broken: string[] = [];
  const text = readFileSync(file, 'utf8').replace(/^```[\s\S]*?^```/gm, '');
  for (const m of text.matchAll(/\]\(([^)\s]+)\)/g)) {
    const target = m[1]!;
    if (/^[a-z]+:/i.test(target)) continue;
    const [path, anchor] = target.split('#') as [string, string | undefined];
    const dest = path === '' ? file : resolve(dirname(file), path);
    if (!existsSync(dest)) broken.push(`${target} (no such file)`);
    else if (anchor !== undefined && dest.endsWith('.md') && !anchorsOf(dest).has(anchor)) broken.push(`${target} (no such heading or anchor)`);
  }
  return broken.map((b) => `${relative(repoRoot, file)}: ${b}`);
}

describe('guides', () => {
  it('exist, each with code', () => {
    expect(guides.length).toBeGreaterThanOrEqual(5);
    for (const g of guides) expect(moduleOf(readFileSync(join(guidesDir, g), 'utf8')).blocks, `${g} has no ts block`).toBeGreaterThan(0);
  });

  it('type-check against the sources', () => {
    const errors = [...typeCheck().values()].flat();
    expect(errors, errors.join('\n')).toEqual([]);
  }, 120_000);

  it('link to files, headings and anchors that exist', () => {
    const pages = [...readdirSync(guidesDir).filter((f) => f.endsWith('.md')).map((f) => join(guidesDir, f)), join(repoRoot, 'docs', 'api.md')];
    const broken = pages.flatMap(brokenLinks);
    expect(broken, broken.join('\n')).toEqual([]);
  });
});
