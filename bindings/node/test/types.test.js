'use strict';
// index.d.ts against the seed: the seed's TypeScript examples type-check against it (strict), and
// its mistakes are caught at compile time as the seed says ("TypeScript catches it"), with
// Debian's TypeScript compiler (node-typescript).

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const examples = require('./support/seed-examples');

const ts = require('/usr/share/nodejs/typescript');
const packageFolder = path.resolve(__dirname, '..');

/** What the seed's examples leave to the app. */
const APP = `
declare const token: string;
declare const pin: string;
interface Tokens { accessToken: string; refreshToken: string; username?: string }
interface Session { accessToken: string }
declare function isExpired(token: string): boolean;
declare function turnOffBiometricSignIn(): Promise<void>;
declare const api: { refresh(token: string): Promise<Tokens> };
`;

/** The diagnostics of compiling `files` (name → source) strictly, as ES2022 modules. */
function diagnose(files) {
  const folder = fs.mkdtempSync(path.join(os.tmpdir(), 'keychain-node-types-'));
  try {
    const names = Object.entries(files).map(([name, source]) => {
      const file = path.join(folder, name);
      fs.writeFileSync(file, source);
      return file;
    });
    const program = ts.createProgram(names, {
      strict: true, noEmit: true, target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ES2022,
      moduleResolution: ts.ModuleResolutionKind.NodeJs, types: [], lib: ['lib.es2022.d.ts'],
    });
    return ts.getPreEmitDiagnostics(program).map((d) => {
      const where = d.file ? `${path.basename(d.file.fileName)}:${d.file.getLineAndCharacterOfPosition(d.start).line + 1}: ` : '';
      return where + ts.flattenDiagnosticMessageText(d.messageText, '\n');
    });
  } finally {
    fs.rmSync(folder, { recursive: true, force: true });
  }
}

test('the declarations compile strictly, and the seed\'s examples type-check against them', () => {
  const files = { 'app.d.ts': APP };
  for (const number of ['000', '001', '004']) {
    for (const module of examples.document(number, packageFolder).modules) {
      files[module.name.replace(/\.mjs$/, '.ts')] = module.source;
    }
  }
  assert.deepEqual(diagnose(files), []);
});

test('the declarations catch what the seed says TypeScript catches', () => {
  const source = (body) => ({ 'app.ts': `import { createKeychain, AccessControl, keychain } from ${JSON.stringify(packageFolder)};\n${body}\nexport {};` });
  assert.match(diagnose(source("createKeychain({ acessControl: 'biometryAny' });")).join('\n'), /acessControl/);
  assert.match(diagnose(source("createKeychain({ accessControl: 'faceID' });")).join('\n'), /faceID/);
  assert.match(diagnose(source("const n: number = await keychain.getItem('k');")).join('\n'), /string \| null/);
  assert.deepEqual(diagnose(source("const v: string | null = await keychain.getItem('k', { prompt: { title: 'x' } });")), []);
});
