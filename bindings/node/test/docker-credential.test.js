'use strict';
// docker-credential-keychain against the reference: the same requests, in the same order, through
// ours (keychaind on a private swtpm) and Debian's docker-credential-secretservice (golang-docker-
// credential-helpers, on gnome-keyring on a private session bus): the same output and exit status
// for each, as the Docker CLI reads them.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { startDaemon, childEnvironment } = require('./support/daemon');

const helper = path.resolve(__dirname, '../bin/docker-credential-keychain');
const URL = 'https://index.docker.io/v1/';
const credentials = (fields) => JSON.stringify(fields);

/** The requests, each `[name, argv, stdin, compare]`: compare 'all' (output and status) or 'status'. */
const STEPS = [
  ['no action', [], '', 'all'],
  ['an unknown action', ['bogus'], '', 'all'],
  ['get of an absent server', ['get'], URL, 'all'],
  ['get of no server', ['get'], '', 'all'],
  ['store', ['store'], credentials({ ServerURL: URL, Username: 'ivan', Secret: 's3cr3t' }), 'all'],
  ['store without a username', ['store'], credentials({ ServerURL: 'https://x.example', Secret: 's' }), 'all'],
  ['store without a server', ['store'], credentials({ Username: 'u', Secret: 's' }), 'all'],
  ['store of malformed JSON', ['store'], '{bad', 'status'],
  ['get, the URL with a newline', ['get'], `${URL}\n`, 'all'],
  ['store of a second server', ['store'], credentials({ ServerURL: 'registry.example:5000', Username: 'ci', Secret: 'tok' }), 'all'],
  ['list', ['list'], '', 'all'],
  ['erase', ['erase'], URL, 'all'],
  ['erase of an absent server', ['erase'], URL, 'all'],
  ['get after erase', ['get'], URL, 'all'],
  ['erase of the second', ['erase'], 'registry.example:5000', 'all'],
  ['list of none', ['list'], '', 'all'],
  ['version', ['version'], '', 'status'],
];

function run(argv0, args, input, env) {
  const done = spawnSync(argv0[0], [...argv0.slice(1), ...args], { input, env, encoding: 'utf8' });
  return { stdout: done.stdout, status: done.status };
}

/** A private session bus with gnome-keyring's Secret Service, unlocked; `stop()` ends both and removes their folder. */
async function referenceBus() {
  const folder = fs.mkdtempSync(path.join(os.tmpdir(), 'keychain-node-docker-'));
  const procs = [];
  const stop = () => {
    for (const p of procs.reverse()) p.kill('SIGKILL');
    fs.rmSync(folder, { recursive: true, force: true });
  };
  try {
    const bus = spawn('dbus-daemon', ['--session', '--nofork', '--print-address=1', `--address=unix:path=${folder}/bus`],
      { stdio: ['ignore', 'pipe', 'ignore'] });
    procs.push(bus);
    await new Promise((resolve) => bus.stdout.once('data', resolve));
    fs.mkdirSync(path.join(folder, 'run'), { mode: 0o700 });
    const env = { PATH: '/usr/bin:/bin', HOME: folder, XDG_DATA_HOME: path.join(folder, 'data'), XDG_RUNTIME_DIR: path.join(folder, 'run'),
      DBUS_SESSION_BUS_ADDRESS: `unix:path=${folder}/bus` };
    const keyring = spawn('gnome-keyring-daemon', ['--unlock', '--components=secrets', '--foreground'], { env, stdio: ['pipe', 'ignore', 'ignore'] });
    procs.push(keyring);
    keyring.stdin.end('a keyring password');
    // Ready when it owns the Secret Service's name on the bus.
    const owned = () => spawnSync('dbus-send', ['--session', '--print-reply', '--dest=org.freedesktop.DBus', '/org/freedesktop/DBus',
      'org.freedesktop.DBus.NameHasOwner', 'string:org.freedesktop.secrets'], { env, encoding: 'utf8' }).stdout?.includes('boolean true');
    for (let tries = 0; !owned(); tries++) {
      if (tries > 200) throw new Error('gnome-keyring-daemon did not take org.freedesktop.secrets within 20 s');
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    return { env, stop };
  } catch (error) {
    stop();
    throw error;
  }
}

describe('docker-credential-keychain', () => {
  let daemon, reference;
  before(async () => {
    daemon = await startDaemon({ reader: false });
    reference = await referenceBus();
  });
  after(async () => {
    reference?.stop();
    await daemon?.stop();
  });

  it('answers each request as Debian\'s docker-credential-secretservice does', () => {
    const ours = childEnvironment({ HOME: daemon.work, KEYCHAIN_SOCKET: daemon.socket });
    for (const [name, args, input, compare] of STEPS) {
      const got = run([process.execPath, helper], args, input, ours);
      const expected = run(['docker-credential-secretservice'], args, input, reference.env);
      if (compare === 'all') {
        assert.deepEqual({ stdout: got.stdout.replace('docker-credential-keychain', 'HELPER'), status: got.status },
          { stdout: expected.stdout.replace('docker-credential-secretservice', 'HELPER'), status: expected.status }, name);
      } else {
        assert.equal(got.status, expected.status, name);
      }
    }
  });

  it('never writes the request back: a malformed one is refused without its text', () => {
    const env = childEnvironment({ HOME: daemon.work, KEYCHAIN_SOCKET: daemon.socket });
    for (const request of ['{"ServerURL":"https://x.example","Username":"u","Secret":hunter2}', 'hunter2 and more']) {
      const got = run([process.execPath, helper], ['store'], request, env);
      assert.equal(got.status, 1);
      assert.doesNotMatch(got.stdout, /hunter2/, 'the secret was written to stdout');
    }
  });

  it('replaces a server\'s credentials when they are stored again, and keeps the secret out of the item\'s label', () => {
    const env = childEnvironment({ HOME: daemon.work, KEYCHAIN_SOCKET: daemon.socket });
    const store = (username, secret) => run([process.execPath, helper], ['store'],
      credentials({ ServerURL: URL, Username: username, Secret: secret }), env);
    assert.equal(store('ivan', 'first').status, 0);
    assert.equal(store('ivan2', 'second').status, 0);
    const got = run([process.execPath, helper], ['get'], URL, env);
    assert.deepEqual(JSON.parse(got.stdout), { ServerURL: URL, Username: 'ivan2', Secret: 'second' });
    const info = JSON.parse(daemon.keychainctl(['info', 'docker-credential-helpers', URL, '--json']));
    assert.equal(info.label, 'ivan2');
    assert.equal(info.accessible, 'afterFirstUnlockThisDeviceOnly');
    assert.equal(run([process.execPath, helper], ['erase'], URL, env).status, 0);
  });
});
