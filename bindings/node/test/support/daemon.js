'use strict';
// A real keychaind on a private swtpm for the tests, as scripts/soak.py starts them: a temporary
// folder, swtpm, keychaind on a private socket (with a fingerprint reader), a passcode set and a
// finger enrolled with keychainctl; `stop()` ends both and removes everything they left.
// The binaries are KEYCHAIN_BIN's, by default the debug build scripts/test.sh makes.

const { spawn, spawnSync } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const repository = path.resolve(__dirname, '../../../..');
const bin = process.env.KEYCHAIN_BIN || path.join(repository, '.build/debug');
const PASSCODE = '2468';
const FINGER = 'thumb';

function waitFor(file, seconds) {
  const until = Date.now() + seconds * 1000;
  return new Promise((resolve, reject) => {
    const look = () => {
      if (fs.existsSync(file)) return resolve();
      if (Date.now() > until) return reject(new Error(`${file} did not appear within ${seconds} s`));
      setTimeout(look, 50);
    };
    look();
  });
}

/** keychainctl through the test's keychaind; stdin carries the passcode (never argv). */
function keychainctl(env, args, input) {
  const done = spawnSync(path.join(bin, 'keychainctl'), args, { env, input: input ?? '', encoding: 'utf8' });
  if (done.status !== 0) throw new Error(`keychainctl ${args.join(' ')}: ${done.stderr || done.error}`);
  return done.stdout;
}

/**
 * Starts swtpm and keychaind; resolves with `{ socket, env, passcode, finger, stop }`.
 * @param {{ reader?: boolean, args?: string[] }} options `reader: false` starts keychaind without a fingerprint
 *   reader; `args`: more of keychaind's arguments (`--idle-timeout 1`).
 */
async function startDaemon(options = {}) {
  for (const tool of ['keychaind', 'keychainctl']) {
    if (!fs.existsSync(path.join(bin, tool))) {
      throw new Error(`${path.join(bin, tool)} is missing: build first (swift build) or set KEYCHAIN_BIN`);
    }
  }
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'keychain-node-'));
  fs.chmodSync(work, 0o755);
  const tpm = path.join(work, 'tpm');
  fs.mkdirSync(path.join(tpm, 'state'), { recursive: true, mode: 0o700 });
  const procs = [];
  const log = fs.openSync(path.join(work, 'keychaind.log'), 'w');
  const stop = async () => {
    for (const p of procs.reverse()) {
      if (p.exitCode === null && p.signalCode === null) {
        const ended = new Promise((resolve) => p.once('exit', resolve));
        p.kill('SIGKILL');
        await ended;
      }
    }
    fs.closeSync(log);
    // keychaind's turn lock of this swtpm (TPMTurn.lockName): the TPM is gone, and the lock with it.
    const lock = 'tpm-' + crypto.createHash('sha256').update(`swtpm:path=${tpm}/sock`).digest('hex').slice(0, 16) + '.lock';
    const runtime = process.env.XDG_RUNTIME_DIR ?? '';
    for (const folder of [`/tmp/keychain-${process.geteuid()}`, ...(runtime.startsWith('/') ? [`${runtime}/keychain`] : [])]) {
      fs.rmSync(path.join(folder, lock), { force: true });
    }
    fs.rmSync(work, { recursive: true, force: true });
  };
  try {
    const swtpm = spawn('swtpm', ['socket', '--tpm2', '--server', `type=unixio,path=${tpm}/sock,mode=0600`,
      '--ctrl', `type=unixio,path=${tpm}/sock.ctrl,mode=0600`, '--tpmstate', `dir=${tpm}/state,mode=0600`,
      '--flags', 'not-need-init,startup-clear'], { stdio: 'ignore' });
    procs.push(swtpm);
    await waitFor(`${tpm}/sock.ctrl`, 20);
    fs.mkdirSync(path.join(work, 'groups.d'));
    fs.mkdirSync(path.join(work, 'store'), { mode: 0o700 });
    const socket = path.join(work, 'keychaind.sock');
    const reader = options.reader === false ? 'none' : path.join(work, 'reader');
    const daemon = spawn(path.join(bin, 'keychaind'), ['--socket', socket, '--store', path.join(work, 'store'),
      '--tcti', `swtpm:path=${tpm}/sock`, '--groups', path.join(work, 'groups.d'), '--reader', reader, ...(options.args ?? [])],
    { stdio: ['ignore', 'pipe', log] });
    procs.push(daemon);
    await new Promise((resolve, reject) => {
      let out = '';
      daemon.stdout.on('data', (chunk) => {
        out += chunk;
        if (out.includes('ready')) resolve();
      });
      daemon.once('exit', (status) => reject(new Error(`keychaind ended (${status}): ${fs.readFileSync(path.join(work, 'keychaind.log'))}`)));
    });
    daemon.stdout.resume();
    daemon.removeAllListeners('exit');
    fs.chmodSync(socket, 0o666);
    const env = { PATH: '/usr/bin:/bin', HOME: work, KEYCHAIN_SOCKET: socket, LANG: 'C.UTF-8' };
    keychainctl(env, ['passcode', 'set'], `${PASSCODE}\n`);
    if (options.reader !== false) keychainctl(env, ['reader', 'enroll', FINGER], `${PASSCODE}\n`);
    /** Ends keychaind at once (SIGKILL), as a crash would; swtpm stays until `stop()`. */
    const kill = () => new Promise((resolve) => { daemon.once('exit', resolve); daemon.kill('SIGKILL'); });
    return { socket, env, work, passcode: PASSCODE, finger: FINGER, keychainctl: (args, input) => keychainctl(env, args, input), kill, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

/** A child's environment: PATH (and the dynamic linker's path, for a node run from an unpacked .deb), then `extra`. */
function childEnvironment(extra) {
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin' };
  if (process.env.LD_LIBRARY_PATH) env.LD_LIBRARY_PATH = process.env.LD_LIBRARY_PATH;
  return { ...env, ...extra };
}

module.exports = { startDaemon, childEnvironment, bin, repository };
