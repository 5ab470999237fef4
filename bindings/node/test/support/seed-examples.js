'use strict';
// The seed's JavaScript examples, extracted from the seed texts (shared/seeds 000, 001, 004) so they
// run as written: a document's code blocks become ES modules whose only change is the import lines
// (the package's path for '@apexnative/keychain'; a sibling file's import dropped when the files are
// joined), with TypeScript's annotations erased by Debian's TypeScript compiler (transpileModule:
// erasure only, no type check). A statement followed by "// KeychainError CODE: message …" becomes
// an expectation: it must throw that code and message.

const fs = require('node:fs');
const path = require('node:path');
const { repository } = require('./daemon');

// The copies in the repository (test/seeds: a clean clone has no shared/ beside it); KEYCHAIN_SEEDS names
// another folder, such as the project's shared/seeds, to run the examples as they are there now.
const seeds = process.env.KEYCHAIN_SEEDS || path.join(__dirname, '..', 'seeds');
const DOCUMENTS = { '000': 'AccessControl', '001': 'createKeychain()', '004': 'Sign-in with Face ID' };

const FILE = /^src\/[\w/.]+\.ts$/;
const CODE_START = /^(import |export |const |let |await |async function |function |if \(|\/\/ |\w+\(.*\);$)/;

/** A line of code inside a block: indented, a closing bracket, a statement's end, or a comment. */
function isCode(line) {
  return CODE_START.test(line) || /^\s/.test(line) || /^[}\])]/.test(line) || /[;{(,]$/.test(line);
}

/** The code blocks of a seed text: `{ file?, code }`, in order; a page's "Signature" is a declaration, not an example. */
function blocks(text) {
  const lines = text.split('\n');
  const found = [];
  for (let i = 0; i < lines.length; i++) {
    if (lines[i] === 'Signature') { i += 2; while (i < lines.length && lines[i].trim() !== '') i++; continue; }
    let file;
    if (FILE.test(lines[i].trim()) && lines[i + 2] !== undefined && CODE_START.test(lines[i + 2])) {
      file = lines[i].trim();
      i += 2;
    } else if (!CODE_START.test(lines[i])) {
      continue;
    }
    const code = [];
    while (i < lines.length) {
      if (lines[i].trim() === '') {
        // A blank line inside a block: the block goes on when code follows it.
        if (lines[i + 1] !== undefined && isCode(lines[i + 1]) && !FILE.test(lines[i + 1].trim())) { code.push(''); i++; continue; }
        break;
      }
      if (!isCode(lines[i])) break;
      code.push(lines[i]);
      i++;
    }
    found.push({ file, code: code.join('\n') });
  }
  return found;
}

/** Statements each followed by the error they throw (the seed's "// KeychainError CODE: message …"). */
function expectations(code) {
  const lines = code.split('\n');
  const out = [];
  for (let i = 0; i + 1 < lines.length; i++) {
    const match = lines[i + 1].match(/^\/\/ KeychainError (\w+): (.*?)\s*…?$/);
    if (match) out.push({ statement: lines[i], code: match[1], message: match[2] });
  }
  return out.length > 0 && out.length * 2 === lines.filter((l) => l.trim()).length ? out : null;
}

const exportedNames = (code) => [...code.matchAll(/^export (?:const|let|async function|function) (\w+)/gm)].map((m) => m[1]);

/**
 * The modules of one document: `{ name, source }` (TypeScript, imports fixed), and its expectations.
 * Blocks go to the file before them; a document whose files export no name twice is one module
 * (its files joined, their imports of each other dropped), else one module per file.
 */
function document(number, packagePath) {
  const file = fs.readdirSync(seeds).find((name) => name.startsWith(`${number}_`));
  if (!file) throw new Error(`seed ${number} is not in ${seeds} (set KEYCHAIN_SEEDS to the seeds' folder)`);
  const text = fs.readFileSync(path.join(seeds, file), 'utf8');
  const files = [];
  const checks = [];
  let current;
  for (const block of blocks(text)) {
    const expected = expectations(block.code);
    if (expected) { checks.push(...expected); continue; }
    if (block.file || !current) {
      current = files.find((f) => f.name === (block.file ?? 'main.ts'));
      if (!current) files.push(current = { name: block.file ?? 'main.ts', parts: [] });
    }
    current.parts.push(block.code);
  }
  const names = files.flatMap((f) => exportedNames(f.parts.join('\n')));
  const joined = new Set(names).size === names.length;
  const groups = joined ? [{ name: 'main.ts', parts: files.flatMap((f) => f.parts) }] : files;
  const modules = groups.map((group) => ({
    name: `${number}-${path.basename(group.name, '.ts')}.mjs`,
    source: fixImports(group.parts.join('\n\n'), packagePath, joined ? null : number),
  }));
  return { title: DOCUMENTS[number], modules, checks, blockCount: blocks(text).length };
}

/**
 * The import lines: the seed's of '@apexnative/keychain' become one of the package's path (blocks joined
 * may import a name twice); a sibling's import is dropped when the files are one module.
 */
function fixImports(source, packagePath, separate) {
  const names = new Set();
  const body = source
    .replace(/^import \{([^}]*)\} from '@apexnative\/keychain';\n?/gm, (_, list) => {
      for (const name of list.split(',').map((n) => n.trim()).filter(Boolean)) names.add(name);
      return '';
    })
    .replace(/^import [^;]*? from '\.\/(\w+)';$/gm, (line, sibling) => (separate
      ? line.replace(`'./${sibling}'`, `'./${separate}-${sibling}.mjs'`) : ''));
  return `import { ${[...names].join(', ')} } from ${JSON.stringify(packagePath)};\n${body}`;
}

/** TypeScript to JavaScript by erasure only (Debian's node-typescript). */
function erase(source) {
  let ts;
  try {
    ts = require('/usr/share/nodejs/typescript');
  } catch {
    throw new Error('TypeScript is missing: install Debian\'s node-typescript (scripts/setup-debian.sh)');
  }
  return ts.transpileModule(source, {
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ES2022, verbatimModuleSyntax: false },
  }).outputText;
}

/** Writes a document's modules as .mjs files in `folder`; returns their paths. */
function write(number, folder, packagePath) {
  const doc = document(number, packagePath);
  const paths = doc.modules.map((module) => {
    const file = path.join(folder, module.name);
    fs.writeFileSync(file, erase(module.source));
    return file;
  });
  return { ...doc, paths };
}

module.exports = { blocks, document, write, erase, seeds };
