'use strict';
// A program outside the checkout, built only from what the package installs: a folder of its own
// with a package.json, the package installed from its folder by npm (offline: no registry, no
// dependencies), then `import` and `require` of it by name storing and reading a secret behind the
// passcode through keychaind, the passcode on stdin (never argv).

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { startDaemon, childEnvironment } = require('./support/daemon');

const packageFolder = path.resolve(__dirname, '..');

const ESM = `import { AccessControl, createKeychain, setPromptHandler } from 'keychain-linux';
import { readFileSync } from 'node:fs';
const passcode = readFileSync(0, 'utf8').trim();
setPromptHandler(() => ({ passcode }));
const vault = createKeychain({ service: 'outside.app', accessControl: AccessControl.Passcode });
await vault.setItem('apiKey', 'outside-secret');
console.log(JSON.stringify({ value: await vault.getItem('apiKey'), info: (await vault.getItemInfo('apiKey')).accessControl }));
`;

const CJS = `const { createKeychain, setPromptHandler } = require('keychain-linux');
setPromptHandler(() => 'cancel');
createKeychain({ service: 'outside.app' }).getItem('apiKey')
  .then(() => console.log('read without the passcode'), (error) => console.log(error.code));
`;

describe('a program outside the checkout', () => {
  let daemon, app;
  before(async () => {
    daemon = await startDaemon({ reader: false });
    app = fs.mkdtempSync(path.join(os.tmpdir(), 'keychain-node-app-'));
    fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }));
  });
  after(async () => {
    await daemon?.stop();
    if (app) fs.rmSync(app, { recursive: true, force: true });
  });

  it('installs the package from its folder with npm, offline, and keeps a secret behind the passcode', (t) => {
    const npm = spawnSync('npm', ['install', '--offline', '--no-audit', '--no-fund', '--install-links', packageFolder],
      { cwd: app, encoding: 'utf8', env: { ...process.env, npm_config_cache: path.join(app, '.npm') } });
    if (npm.error?.code === 'ENOENT') {
      // Debian's nodejs comes without npm: the package is then copied where npm would put it.
      t.diagnostic('npm is not installed: the package is copied into node_modules/keychain-linux');
      fs.cpSync(packageFolder, path.join(app, 'node_modules/keychain-linux'), {
        recursive: true, filter: (source) => !source.includes(`${path.sep}test`) && !source.endsWith(`${path.sep}node_modules`),
      });
    } else {
      assert.equal(npm.status, 0, npm.stderr);
      assert.equal(fs.lstatSync(path.join(app, 'node_modules/keychain-linux')).isSymbolicLink(), false, 'a copy, not a link to the checkout');
    }
    fs.writeFileSync(path.join(app, 'app.mjs'), ESM);
    fs.writeFileSync(path.join(app, 'app.cjs'), CJS);
    const env = childEnvironment({ HOME: app, KEYCHAIN_SOCKET: daemon.socket });
    const run = (file, input) => spawnSync(process.execPath, [file], { cwd: app, env, input, encoding: 'utf8' });
    const esm = run('app.mjs', `${daemon.passcode}\n`);
    assert.equal(esm.status, 0, esm.stderr);
    assert.deepEqual(JSON.parse(esm.stdout), { value: 'outside-secret', info: 'passcode' });
    const cjs = run('app.cjs', '');
    assert.equal(cjs.status, 0, cjs.stderr);
    assert.equal(cjs.stdout.trim(), 'USER_CANCELED');
  });
});
