'use strict';
// The package against a real keychaind on a private swtpm (started and removed by the helper): the
// item calls, the option checks, an access control answered by the prompt handler (passcode and
// finger), wrong answers, each ending's code, two uids kept apart, and a socket nobody should trust.

const { describe, it, before, after, afterEach } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { startDaemon, childEnvironment } = require('./support/daemon');
const {
  AccessControl, Accessible, KeychainError, KeychainErrorCode, createKeychain, canUseAccessControl, getBiometryTypes,
  setPromptHandler,
} = require('..');

/** A handler that answers from a list and records what it was asked; asked once too often, it fails the test. */
function scripted(...answers) {
  const asked = [];
  const handler = (request) => {
    asked.push(request);
    assert.ok(answers.length > 0, `asked once too often: ${JSON.stringify(request)}`);
    return answers.shift();
  };
  return { handler, asked };
}

describe('through keychaind', () => {
  let daemon;
  before(async () => {
    daemon = await startDaemon();
    process.env.KEYCHAIN_SOCKET = daemon.socket;
  });
  after(async () => {
    await daemon?.stop();
  });
  afterEach(() => setPromptHandler(undefined));

  it('stores, reads, lists, describes and removes items', async () => {
    const storage = createKeychain({ service: 'node.items' });
    assert.equal(await storage.getItem('token'), null);
    assert.equal(await storage.hasItem('token'), false);
    await storage.setItem('token', 'first', { label: 'ivan@example.com' });
    await storage.setItem('token', 'ünïcödé ✓ value');
    await storage.setItem('other', '');
    assert.equal(await storage.getItem('token'), 'ünïcödé ✓ value');
    assert.equal(await storage.getItem('other'), '');
    assert.equal(await storage.hasItem('token'), true);
    assert.deepEqual(await storage.getAllKeys(), ['other', 'token']);
    const info = await storage.getItemInfo('token');
    assert.equal(info.key, 'token');
    assert.equal(info.service, 'node.items');
    assert.equal(info.accessible, Accessible.AfterFirstUnlock);
    assert.equal(info.accessControl, AccessControl.None);
    assert.equal(info.securityLevel, 'softwareTPM');
    assert.ok(info.created instanceof Date && info.modified >= info.created);
    assert.ok(Math.abs(info.modified - Date.now()) < 24 * 3600 * 1000, `${info.modified} is today`);
    assert.equal(await storage.getItemInfo('absent'), null);
    await storage.removeItem('token');
    await storage.removeItem('token');
    assert.deepEqual(await storage.getAllKeys(), ['other']);
    await storage.clear();
    assert.deepEqual(await storage.getAllKeys(), []);
  });

  it('keeps each service to its own items, and answers many calls at once', async () => {
    const a = createKeychain({ service: 'node.a' }), b = createKeychain({ service: 'node.b' });
    await Promise.all(Array.from({ length: 20 }, (_, i) => a.setItem(`k${i}`, `a${i}`)));
    await b.setItem('k0', 'b0');
    const values = await Promise.all(Array.from({ length: 20 }, (_, i) => a.getItem(`k${i}`)));
    assert.deepEqual(values, Array.from({ length: 20 }, (_, i) => `a${i}`));
    assert.equal(await b.getItem('k0'), 'b0');
    await b.clear();
    assert.equal(await a.getItem('k0'), 'a0');
    await a.clear();
  });

  it('checks options at once with the seed\'s messages, without touching the keychain', () => {
    const cases = [
      [{ accessControl: AccessControl.BiometryCurrentSet, authValidity: 30 },
        "accessControl 'biometryCurrentSet' can't be used with authValidity > 0 (got 30): set authValidity to 0, or use 'biometryAny' to allow a window"],
      [{ synchronizable: true, accessible: Accessible.AfterFirstUnlockThisDeviceOnly },
        "synchronizable can't be used with accessible 'afterFirstUnlockThisDeviceOnly': a ThisDeviceOnly item never leaves this device; set synchronizable to false, or use accessible 'afterFirstUnlock'"],
      [{ service: '' }, 'Invalid service: expected a non-empty string of up to 256 characters, got an empty string'],
      [{ acessControl: 'biometryAny' }, "Invalid keychain options: unknown option 'acessControl'"],
      [{ prompt: { titel: 'x' } }, "Invalid keychain options: unknown option 'prompt.titel'"],
      [{ b: 1, a: 2 }, "Invalid keychain options: unknown options 'a', 'b'"],
      [{ accessible: 'sometimes' }, "Invalid accessible: expected one of 'whenUnlocked', 'afterFirstUnlock', 'always', "
        + "'whenPasscodeSetThisDeviceOnly', 'whenUnlockedThisDeviceOnly', 'afterFirstUnlockThisDeviceOnly', 'alwaysThisDeviceOnly', got 'sometimes'"],
      [{ authValidity: 1.5 }, 'Invalid authValidity: expected a whole number of seconds, 0 or more, got 1.5'],
      [{ authValidity: -1 }, 'Invalid authValidity: expected a whole number of seconds, 0 or more, got -1'],
      [{ synchronizable: 'yes' }, "Invalid synchronizable: expected true or false, got 'yes'"],
      [{ synchronizable: true, accessControl: AccessControl.Passcode },
        "synchronizable can't be used with accessControl 'passcode': an item behind authentication never leaves this device; set synchronizable to false, or use accessControl 'none'"],
      [{ accessGroup: '' }, 'Invalid accessGroup: expected a non-empty string, got an empty string; leave it out for the default group'],
      [{ prompt: 'Unlock' }, "Invalid prompt: expected an object with the keys title, subtitle, description, cancel, got 'Unlock'"],
      [{ android: { keyStorage: 'sd' } }, "Invalid android.keyStorage: expected one of 'tee', 'strongbox', got 'sd'"],
      ['vault', "Invalid keychain options: expected an object with the keys service, accessible, accessControl, authValidity, "
        + "synchronizable, accessGroup, prompt, android, got 'vault'"],
    ];
    const socket = process.env.KEYCHAIN_SOCKET;
    process.env.KEYCHAIN_SOCKET = '/nonexistent/keychaind.sock';
    try {
      for (const [options, message] of cases) {
        assert.throws(() => createKeychain(options), (error) => error instanceof KeychainError
          && error.code === KeychainErrorCode.InvalidArgument && error.message === message, JSON.stringify(options));
      }
      assert.equal(createKeychain({ service: 'x', accessControl: 'biometryCurrentSet' }).service, 'x');
    } finally {
      process.env.KEYCHAIN_SOCKET = socket;
    }
  });

  it('checks a call\'s arguments and overrides, and keychaind\'s own refusals come with its code and message', async () => {
    const storage = createKeychain({ service: 'node.args', accessControl: AccessControl.BiometryCurrentSet });
    await assert.rejects(storage.setItem('k', 'v', { authValidity: 10 }), {
      code: 'INVALID_ARGUMENT',
      message: "accessControl 'biometryCurrentSet' can't be used with authValidity > 0 (got 10): set authValidity to 0, or use 'biometryAny' to allow a window",
    });
    await assert.rejects(storage.setItem('k', 42), { code: 'INVALID_ARGUMENT', message: 'Invalid value: expected a string, got 42' });
    await assert.rejects(storage.getItem('k', { promt: {} }), { code: 'INVALID_ARGUMENT', message: "Invalid keychain options: unknown option 'promt'" });
    await assert.rejects(storage.setItem('x'.repeat(1025), 'v', { accessControl: AccessControl.None }), {
      code: 'INVALID_ARGUMENT', message: 'Invalid key: expected a non-empty string of up to 1024 bytes, got 1025 bytes',
    });
    await assert.rejects(canUseAccessControl('faceID'), { code: 'INVALID_ARGUMENT' });
  });

  it('reads an item behind the passcode through the prompt handler, which a write never asks', async () => {
    const vault = createKeychain({ service: 'node.vault', accessControl: AccessControl.Passcode,
      prompt: { title: 'Unlock your account', cancel: 'Use password' } });
    setPromptHandler(() => assert.fail('a write asked the user'));
    await vault.setItem('pin', '1234-secret');
    assert.equal(await vault.hasItem('pin'), true);
    assert.equal((await vault.getItemInfo('pin')).accessControl, AccessControl.Passcode);
    const { handler, asked } = scripted({ passcode: daemon.passcode });
    setPromptHandler(handler);
    assert.equal(await vault.getItem('pin', { prompt: { title: 'Confirm the payment' } }), '1234-secret');
    assert.equal(asked.length, 1);
    assert.equal(asked[0].title, 'Confirm the payment');
    assert.equal(asked[0].cancel, 'Use password');  // merged field by field with the storage's
    assert.deepEqual(asked[0].methods, ['passcode']);
    assert.equal(asked[0].service, 'node.vault');
    assert.equal(asked[0].key, 'pin');
    assert.equal(asked[0].attempt, 1);
  });

  it('asks again after a wrong passcode, then fails with AUTHENTICATION_FAILED', async () => {
    const vault = createKeychain({ service: 'node.wrong', accessControl: AccessControl.Passcode });
    await vault.setItem('pin', 'v');
    const twice = scripted({ passcode: '0000' }, { passcode: daemon.passcode });
    setPromptHandler(twice.handler);
    assert.equal(await vault.getItem('pin'), 'v');
    assert.equal(twice.asked[1].attempt, 2);
    assert.match(twice.asked[1].previousFailure, /wrong passcode/);
    const wrong = scripted({ passcode: '1111' }, { passcode: '2222' });
    setPromptHandler(wrong.handler, { attemptsPerRead: 2 });
    await assert.rejects(vault.getItem('pin'), { code: KeychainErrorCode.AuthenticationFailed });
    assert.equal(wrong.asked.length, 2);
  });

  it('ends a prompt with the seed\'s code for each ending, and the item stays', async () => {
    const vault = createKeychain({ service: 'node.endings', accessControl: AccessControl.BiometryAnyOrPasscode });
    await vault.setItem('t', 'v');
    for (const [answer, code] of [['cancel', 'USER_CANCELED'], ['fallback', 'USER_FALLBACK'], ['interrupted', 'SYSTEM_CANCELED'],
      [{ unavailable: 'kiosk mode' }, 'INTERACTION_NOT_ALLOWED']]) {
      setPromptHandler(scripted(answer).handler);
      await assert.rejects(vault.getItem('t'), { code }, code);
    }
    setPromptHandler(null);  // no handler at all: the read says so, and keychaind refuses it without asking
    await assert.rejects(vault.getItem('t'), { code: 'INTERACTION_NOT_ALLOWED', message: /no authenticator can ask/ });
    setPromptHandler(undefined);  // the default, with no terminal (node --test's stdin is not one)
    await assert.rejects(vault.getItem('t'), { code: 'INTERACTION_NOT_ALLOWED', message: /no terminal/ });
    await assert.rejects(Promise.resolve().then(() => setPromptHandler('yes')), { code: 'INVALID_ARGUMENT' });
    setPromptHandler(() => ({ pin: '1' }));
    await assert.rejects(vault.getItem('t'), { code: 'INVALID_ARGUMENT', message: /Invalid prompt answer/ });
    const failure = new Error('the handler failed');
    setPromptHandler(async () => { throw failure; });
    await assert.rejects(vault.getItem('t'), (error) => error === failure);
    setPromptHandler(scripted({ passcode: daemon.passcode }).handler);
    assert.equal(await vault.getItem('t'), 'v');
  });

  it('asks on the terminal by default, the passcode without echo', async () => {
    const vault = createKeychain({ service: 'node.terminal', accessControl: AccessControl.Passcode, prompt: { title: 'Unlock the vault' } });
    await vault.setItem('t', 'terminal-value');
    const folder = fs.mkdtempSync(path.join(os.tmpdir(), 'keychain-node-tty-'));
    const child = path.join(folder, 'child.js');
    fs.writeFileSync(child, `require(${JSON.stringify(path.resolve(__dirname, '..'))})
      .createKeychain({ service: 'node.terminal', prompt: { title: 'Unlock the vault' } })
      .getItem('t').then((v) => console.log('value=' + v), (e) => console.log('error=' + e.code));`);
    // script(1) runs the child on a new pseudo-terminal: its stdin and /dev/tty are that terminal.
    const run = require('node:child_process').spawn('script', ['-qfec', `${process.execPath} ${child}`, '/dev/null'],
      { env: childEnvironment({ KEYCHAIN_SOCKET: daemon.socket, TERM: 'dumb' }), stdio: ['pipe', 'pipe', 'inherit'] });
    let seen = '';
    try {
      await new Promise((resolve, reject) => {
        run.stdout.on('data', (chunk) => {
          seen += chunk;
          // Typed only once the prompt is up (raw mode, no echo): typed earlier, the terminal's own echo would show it.
          if (seen.includes('Passcode (enter alone: Cancel): ') && !run.typed) { run.typed = true; run.stdin.write(`${daemon.passcode}\r`); }
          if (/value=|error=/.test(seen)) resolve();
        });
        run.once('exit', () => resolve());
        run.once('error', reject);
      });
    } finally {
      run.kill();
      fs.rmSync(folder, { recursive: true, force: true });
    }
    assert.match(seen, /Unlock the vault/);
    assert.match(seen, /value=terminal-value/);
    assert.doesNotMatch(seen, new RegExp(daemon.passcode), 'the passcode was echoed');
  });

  it('answers canUseAccessControl from the device, and noPrompt when nothing can ask the user', async () => {
    assert.deepEqual(await getBiometryTypes(), ['fingerprint']);
    setPromptHandler(() => 'cancel');
    assert.deepEqual(await canUseAccessControl(AccessControl.BiometryCurrentSet), { available: true });
    assert.deepEqual(await canUseAccessControl(AccessControl.None), { available: true });
    setPromptHandler(undefined);
    assert.deepEqual(await canUseAccessControl(AccessControl.Passcode), { available: false, reason: 'noPrompt' });
    assert.deepEqual(await createKeychain({ service: 'x' }).canUseAccessControl(AccessControl.None), { available: true });
  });

  it('opens a biometryCurrentSet item with the enrolled finger, refuses another, and loses it when the fingers change', async () => {
    const vault = createKeychain({ service: 'node.fingers', accessible: Accessible.WhenUnlockedThisDeviceOnly,
      accessControl: AccessControl.BiometryCurrentSet });
    await vault.setItem('refreshToken', 'rt-1');
    const right = scripted({ finger: daemon.finger });
    setPromptHandler(right.handler);
    assert.equal(await vault.getItem('refreshToken'), 'rt-1');
    assert.deepEqual(right.asked[0].methods, ['fingerprint']);
    setPromptHandler(scripted({ finger: 'index' }, { finger: 'pinky' }).handler, { attemptsPerRead: 2 });
    await assert.rejects(vault.getItem('refreshToken'), { code: 'AUTHENTICATION_FAILED' });
    daemon.keychainctl(['reader', 'enroll', 'index'], `${daemon.passcode}\n`);
    setPromptHandler(scripted({ finger: daemon.finger }).handler);
    await assert.rejects(vault.getItem('refreshToken'), { code: KeychainErrorCode.KeyInvalidated });
    assert.equal(await vault.hasItem('refreshToken'), false);
  });

  it('keeps two users\' items apart: nobody sees root\'s item of the same service and key', async () => {
    const root = createKeychain({ service: 'node.shared' });
    await root.setItem('k', 'root-secret');
    const script = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'keychain-node-uid-')), 'nobody.js');
    fs.chmodSync(path.dirname(script), 0o755);
    fs.writeFileSync(script, `
      const { createKeychain } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
      (async () => {
        const s = createKeychain({ service: 'node.shared' });
        const before = await s.getItem('k');
        await s.setItem('k', 'nobody-value');
        console.log(JSON.stringify({ before, after: await s.getItem('k'), keys: await s.getAllKeys() }));
      })().catch((e) => { console.log(JSON.stringify({ code: e.code, message: e.message })); process.exit(1); });`, { mode: 0o644 });
    const done = spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, script],
      { env: childEnvironment({ KEYCHAIN_SOCKET: daemon.socket }), encoding: 'utf8' });
    fs.rmSync(path.dirname(script), { recursive: true, force: true });
    assert.equal(done.status, 0, done.stdout + done.stderr);
    assert.deepEqual(JSON.parse(done.stdout), { before: null, after: 'nobody-value', keys: ['k'] });
    assert.equal(await root.getItem('k'), 'root-secret');
    await root.clear();
  });

  it('sends nothing to a socket another user planted where KEYCHAIN_SOCKET points', async () => {
    const folder = fs.mkdtempSync(path.join(os.tmpdir(), 'keychain-node-impostor-'));
    fs.chmodSync(folder, 0o777);
    const planted = path.join(folder, 'keychaind.sock');
    // The impostor listens as nobody and reports every byte it receives.
    const impostor = require('node:child_process').spawn('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups',
      process.execPath, '-e', `require('net').createServer((c) => c.on('data', (d) => process.stdout.write(d.toString('hex'))))
        .listen(${JSON.stringify(planted)}, () => process.stdout.write('listening\\n'))`], { stdio: ['ignore', 'pipe', 'inherit'] });
    let heard = '';
    impostor.stdout.on('data', (chunk) => { heard += chunk; });
    try {
      while (!heard.includes('listening')) await new Promise((resolve) => setTimeout(resolve, 20));
      assert.equal(fs.statSync(planted).uid, 65534);
      const socket = process.env.KEYCHAIN_SOCKET;
      process.env.KEYCHAIN_SOCKET = planted;
      try {
        await assert.rejects(createKeychain({ service: 'node.impostor' }).setItem('k', 'a secret for root only'), {
          code: 'HARDWARE_UNAVAILABLE',
          message: new RegExp(`^The keychain service at ${planted} is not trusted: its socket belongs to uid 65534, and only root`),
        });
      } finally {
        process.env.KEYCHAIN_SOCKET = socket;
      }
      // Give a connection that was made the time to deliver what was sent.
      await new Promise((resolve) => setTimeout(resolve, 200));
      assert.equal(heard, 'listening\n', 'the impostor received bytes');
    } finally {
      impostor.kill();
      fs.rmSync(folder, { recursive: true, force: true });
    }
  });

  it('says keychaind is not running when nothing answers, and never hangs', async () => {
    const socket = process.env.KEYCHAIN_SOCKET;
    const folder = fs.mkdtempSync(path.join(os.tmpdir(), 'keychain-node-none-'));
    const dead = path.join(folder, 'dead.sock');
    const server = net.createServer();
    await new Promise((resolve) => server.listen(dead, resolve));
    await new Promise((resolve) => server.close(resolve));  // a socket file nothing listens on
    process.env.KEYCHAIN_SOCKET = path.join(folder, 'absent.sock');
    try {
      await assert.rejects(createKeychain({ service: 'x' }).getItem('k'), {
        code: 'HARDWARE_UNAVAILABLE', message: /^The keychain service is not running: nothing answers on/,
      });
      delete process.env.KEYCHAIN_SOCKET;
      process.env.KEYCHAIN_STORE = '/var/lib/keychain/store';
      await assert.rejects(createKeychain({ service: 'x' }).getItem('k'), { code: 'HARDWARE_UNAVAILABLE', message: /KEYCHAIN_STORE/ });
    } finally {
      delete process.env.KEYCHAIN_STORE;
      process.env.KEYCHAIN_SOCKET = socket;
      fs.rmSync(folder, { recursive: true, force: true });
    }
  });
});
