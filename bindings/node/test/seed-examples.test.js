'use strict';
// The seed's own examples (docs 000, 001 and the sign-in guide 004), extracted from the seed texts
// and run against a real keychaind: only their import lines differ (support/seed-examples.js). What
// they leave to the app (a token, the server's API, isExpired, turnOffBiometricSignIn) is given here,
// and the user at the prompt is a handler that touches the reader with the enrolled finger.

const { describe, it, before, after, afterEach } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { pathToFileURL } = require('node:url');
const { startDaemon } = require('./support/daemon');
const examples = require('./support/seed-examples');
const { AccessControl, Accessible, createKeychain, setPromptHandler } = require('..');

const packagePath = path.resolve(__dirname, '../index.mjs');

describe('the seed\'s examples', () => {
  let daemon, folder;
  const asked = [];
  let answer;
  before(async () => {
    daemon = await startDaemon();
    process.env.KEYCHAIN_SOCKET = daemon.socket;
    process.env.KEYCHAIN_APP_ID = 'com.example.app';
    folder = fs.mkdtempSync(path.join(os.tmpdir(), 'keychain-node-seed-'));
  });
  after(async () => {
    await daemon?.stop();
    if (folder) fs.rmSync(folder, { recursive: true, force: true });
    for (const name of ['token', 'pin', 'api', 'isExpired', 'turnOffBiometricSignIn']) delete globalThis[name];
  });
  const touch = () => {
    answer = { finger: daemon.finger };
    setPromptHandler((request) => { asked.push(request); return answer; });
  };
  afterEach(() => setPromptHandler(undefined));

  it('finds every example of the three documents', () => {
    const counts = Object.fromEntries(['000', '001', '004'].map((n) => {
      const doc = examples.document(n, packagePath);
      return [n, { blocks: doc.blockCount, modules: doc.modules.map((m) => m.name), checks: doc.checks.length }];
    }));
    assert.deepEqual(counts, {
      '000': { blocks: 2, modules: ['000-main.mjs'], checks: 0 },
      '001': { blocks: 5, modules: ['001-main.mjs', '001-vault.mjs', '001-storage.mjs'], checks: 3 },
      '004': { blocks: 7, modules: ['004-main.mjs'], checks: 0 },
    });
  });

  it('000: AccessControl usage stores the refresh token when the device can lock it with biometrics', async () => {
    globalThis.token = 'refresh-token-000';
    touch();
    const { paths } = examples.write('000', folder, packagePath);
    for (const file of paths) await import(pathToFileURL(file));
    touch();
    assert.equal(await createKeychain({ service: 'vault' }).getItem('refreshToken'), 'refresh-token-000');
    assert.equal(asked.at(-1).service, 'vault');
  });

  it('001: createKeychain checks its options at once, with the messages the seed shows', () => {
    const { checks } = examples.document('001', packagePath);
    for (const check of checks) {
      const run = new Function('createKeychain', 'AccessControl', 'Accessible', check.statement);
      assert.throws(() => run(createKeychain, AccessControl, Accessible), (error) => error.code === check.code
        && error.message.startsWith(check.message), check.statement);
    }
  });

  it('001: a vault behind biometrics, its per-call overrides and a read\'s prompt merged field by field', async () => {
    globalThis.token = 'refresh-token-001';
    globalThis.pin = '1234-pin';
    touch();
    asked.length = 0;
    const { paths } = examples.write('001', folder, packagePath);
    const modules = {};
    for (const file of paths) modules[path.basename(file)] = await import(pathToFileURL(file));
    // The reads asked twice: the refresh token with the storage's prompt, the pin with the call's title and the storage's cancel.
    assert.deepEqual(asked.map((r) => [r.key, r.title, r.cancel]),
      [['refreshToken', 'Unlock your account', 'Use password'], ['pin', 'Confirm the payment', 'Use password']]);
    assert.deepEqual(asked[1].methods, ['fingerprint', 'passcode']);
    const { vault } = modules['001-vault.mjs'];
    assert.equal((await vault.getItemInfo('pin')).accessControl, AccessControl.BiometryCurrentSetOrPasscode);
    const storage = modules['001-storage.mjs'];
    assert.equal(storage.session.service, 'com.example.app');
    assert.equal(storage.vault.service, 'auth.vault');
    assert.equal(storage.keys.options.accessible, Accessible.AfterFirstUnlockThisDeviceOnly);
    assert.equal(storage.shared.options.accessGroup, 'ABCDE12345.com.example.shared');
    await vault.clear();
  });

  it('004: sign-in, launch, rotation, each fallback path and sign-out, as the guide wrote them', async () => {
    const refreshed = [];
    let turnedOff = 0;
    globalThis.isExpired = () => true;
    globalThis.api = { refresh: async (token) => { refreshed.push(token); return { accessToken: 'at-2', refreshToken: 'rt-2' }; } };
    globalThis.turnOffBiometricSignIn = async () => { turnedOff++; };
    const [file] = examples.write('004', folder, packagePath).paths;
    touch();
    const guide = await import(pathToFileURL(file));  // its sign-out runs as the module loads: nothing to remove yet

    assert.equal(await guide.biometricOffer(), 'biometrics');  // a fingerprint reader: neither Face ID nor Touch ID
    await guide.completeSignIn({ accessToken: 'at-1', refreshToken: 'rt-1', username: 'ivan@example.com' }, true);
    assert.equal((await guide.vault.getItemInfo('refreshToken')).label, 'ivan@example.com');
    asked.length = 0;
    assert.deepEqual(await guide.restoreSession(), { accessToken: 'at-2' });
    assert.deepEqual(refreshed, ['rt-1']);
    assert.equal(asked.length, 1);
    assert.equal(asked[0].title, 'Sign in to Example');
    assert.equal(await guide.session.getItem('accessToken'), 'at-2');
    assert.equal(await guide.unlockRefreshToken(), 'rt-2');  // rotated, with no prompt at the write

    for (const [given, path] of [['cancel', 'password'], ['fallback', 'password'], ['interrupted', 'signIn']]) {
      answer = given;
      assert.equal(await guide.unlockRefreshToken(), path, given);
    }
    answer = { finger: daemon.finger };
    assert.equal(await guide.vault.hasItem('refreshToken'), true);  // a cancel leaves the token in the vault

    daemon.keychainctl(['reader', 'enroll', 'index'], `${daemon.passcode}\n`);  // new biometrics
    assert.equal(await guide.unlockRefreshToken(), 'signIn');
    assert.equal(turnedOff, 1);
    assert.equal(await guide.vault.hasItem('refreshToken'), false);

    // Sign-out: the module's own lines, run again.
    await guide.completeSignIn({ accessToken: 'at-3', refreshToken: 'rt-3' }, true);
    setPromptHandler(() => assert.fail('clear() asked the user'));
    await import(pathToFileURL(file) + '?sign-out');
    assert.equal(await guide.session.getItem('accessToken'), null);
    assert.deepEqual(await guide.vault.getAllKeys(), []);
  });
});
