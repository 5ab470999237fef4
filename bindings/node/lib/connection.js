'use strict';
// keychaind over its Unix socket: where it is (the rule every front door shares, `DaemonSocket`),
// who may serve it, kept connections, and one call's exchange with the prompts answered on the way
// (Sources/Keychain/Daemon/DaemonClient.swift does the same in Swift).

const net = require('node:net');
const fs = require('node:fs');
const { Kind, Tag, Message, MessageBuilder, WireError, MAX_MESSAGE, decodeCause, encodeAnswer, decodeQuestion } = require('./wire');
const { KeychainError, KeychainErrorCode } = require('./options');

const SYSTEM_SOCKET = '/run/keychain/keychaind.sock';
/** How long a reply may take (keychaind bounds its own TPM commands), and a started frame may stall. */
const REPLY_TIMEOUT = 120, STALL_TIMEOUT = 10;
/** Idle connections kept per socket between calls. */
const MAX_IDLE = 16;
const SERVICE_USER = 'keychaind';

/**
 * keychaind's socket: KEYCHAIN_SOCKET when set and not empty; else, when KEYCHAIN_STORE is unset or
 * empty, the system's socket if it exists (docs/daemon.md, "Callers").
 */
function resolveSocket(env = process.env) {
  if (env.KEYCHAIN_SOCKET) return env.KEYCHAIN_SOCKET;
  if (env.KEYCHAIN_STORE) {
    throw new KeychainError(KeychainErrorCode.HardwareUnavailable, `KEYCHAIN_STORE names a store for a process of its own, `
      + `which Node cannot open: set KEYCHAIN_SOCKET to keychaind's socket (${SYSTEM_SOCKET} on a device where it runs)`);
  }
  if (fs.existsSync(SYSTEM_SOCKET)) return SYSTEM_SOCKET;
  throw new KeychainError(KeychainErrorCode.HardwareUnavailable, `No keychain service to reach: KEYCHAIN_SOCKET is not set `
    + `and ${SYSTEM_SOCKET} does not exist (is keychaind running?)`);
}

/** The uid of the user keychaind runs as (dist/systemd), from /etc/passwd; undefined when there is none. */
let serviceUID;
function serviceUserID() {
  if (serviceUID === undefined) {
    serviceUID = null;
    try {
      for (const line of fs.readFileSync('/etc/passwd', 'utf8').split('\n')) {
        const fields = line.split(':');
        if (fields[0] === SERVICE_USER && /^\d+$/.test(fields[2])) serviceUID = Number(fields[2]);
      }
    } catch { /* no passwd file: no such user */ }
  }
  return serviceUID ?? undefined;
}

/**
 * Who may serve the keychain to this process: root, this process's effective uid, or the user
 * keychaind. Node has no SO_PEERCRED, so the listener is known by its socket file's owner, read
 * before the connect and again after it (the Swift client asks the kernel for the peer's uid).
 */
function untrustedOwner(path) {
  let owner;
  try {
    owner = fs.statSync(path).uid;
  } catch {
    return undefined;  // nothing there: the connect says so
  }
  const me = process.geteuid();
  if (owner === 0 || owner === me || owner === serviceUserID()) return undefined;
  const service = serviceUserID() !== undefined ? `the user ${SERVICE_USER} (uid ${serviceUserID()})` : `the user ${SERVICE_USER}`;
  return new KeychainError(KeychainErrorCode.HardwareUnavailable, `The keychain service at ${path} is not trusted: its socket `
    + `belongs to uid ${owner}, and only root, this user (uid ${me}) or ${service} may serve the keychain; nothing was sent `
    + '(point KEYCHAIN_SOCKET at keychaind\'s socket)');
}

function notRunning(path, error) {
  const errno = typeof error?.errno === 'number' ? -error.errno : 0;
  return new KeychainError(KeychainErrorCode.HardwareUnavailable, `The keychain service is not running: nothing answers on ${path} `
    + '(start keychaind or its socket unit; keychainctl --direct uses a store without the service)', `errno ${Math.abs(errno)}`);
}

/** A socket failure during an exchange (`WireFailure(exchanging:)`). */
function exchangeFailure(path, reason, detail) {
  switch (reason) {
    case 'closed':
      return new KeychainError(KeychainErrorCode.HardwareUnavailable, `The keychain service stopped during the call (${path}): `
        + 'the call may or may not have taken effect; check and retry', detail);
    case 'timedOut':
      return new KeychainError(KeychainErrorCode.HardwareUnavailable,
        `The keychain service did not answer within ${REPLY_TIMEOUT} s (${path})`, detail);
    case 'io':
      return new KeychainError(KeychainErrorCode.HardwareUnavailable, `The keychain service closed the connection (${path}): it may `
        + 'be at its connection limit or stopping; the call may or may not have taken effect; check and retry', detail);
    default:
      return new KeychainError(KeychainErrorCode.Internal, `The keychain service's reply does not decode: ${detail}`);
  }
}

/**
 * One connection to keychaind: frames in, one at a time. `next()` resolves with the next message
 * or rejects with a reason ('closed', 'timedOut', 'io', 'malformed') and whether any byte came.
 */
class Connection {
  constructor(socket, path) {
    this.socket = socket;
    this.path = path;
    this.buffer = Buffer.alloc(0);
    this.waiter = null;
    this.failed = null;
    this.receivedAny = false;
    this.timer = null;
    socket.on('data', (chunk) => this.onData(chunk));
    socket.on('error', (error) => this.fail('io', error));
    socket.on('close', () => this.fail('closed'));
  }

  static open(path) {
    return new Promise((resolve, reject) => {
      const socket = net.connect({ path });
      const failed = (error) => reject(notRunning(path, error));
      socket.once('error', failed);
      socket.once('connect', () => {
        socket.removeListener('error', failed);
        resolve(new Connection(socket, path));
      });
    });
  }

  onData(chunk) {
    this.receivedAny = true;
    // A copy, so the old buffer can be zeroed: values and prompts arrive here.
    const joined = Buffer.concat([this.buffer, chunk]);
    this.buffer.fill(0);
    chunk.fill(0);
    this.buffer = joined;
    this.deliver();
  }

  deliver() {
    if (!this.waiter) return;
    if (this.buffer.length >= 4) {
      const length = this.buffer.readUInt32BE(0);
      if (length < 2 || length > MAX_MESSAGE) return this.fail('malformed', new WireError('badLength', `a frame of ${length} bytes`));
      if (this.buffer.length >= 4 + length) {
        const frame = Buffer.from(this.buffer.subarray(4, 4 + length));
        const rest = Buffer.from(this.buffer.subarray(4 + length));
        this.buffer.fill(0);
        this.buffer = rest;
        const { resolve, reject } = this.takeWaiter();
        try {
          resolve(Message.decode(frame));
        } catch (error) {
          reject({ reason: 'malformed', error, receivedAny: true });
        }
        return;
      }
    }
    this.arm();
  }

  /** The wait's timer: the reply timeout before a frame starts, the stall timeout inside one. */
  arm() {
    clearTimeout(this.timer);
    const seconds = this.buffer.length > 0 ? STALL_TIMEOUT : REPLY_TIMEOUT;
    this.timer = setTimeout(() => this.fail('timedOut', new Error(`no message within ${seconds} s`)), seconds * 1000);
  }

  takeWaiter() {
    clearTimeout(this.timer);
    const waiter = this.waiter;
    this.waiter = null;
    this.socket.unref();
    return waiter;
  }

  fail(reason, error) {
    if (!this.failed) this.failed = { reason, error };
    if (this.waiter) this.takeWaiter().reject({ ...this.failed, receivedAny: this.receivedAny });
    if (reason !== 'closed') this.socket.destroy();
  }

  /** Sends a message and waits for keychaind's next one. */
  exchange(builder) {
    return new Promise((resolve, reject) => {
      if (this.failed) return reject({ ...this.failed, receivedAny: this.receivedAny });
      this.waiter = { resolve, reject };
      this.socket.ref();
      const frame = builder.encode(true);
      this.socket.write(frame, () => frame.fill(0));
      this.deliver();
    });
  }

  get reusable() { return !this.failed && this.buffer.length === 0 && !this.socket.destroyed; }

  close() {
    clearTimeout(this.timer);
    this.buffer.fill(0);
    this.socket.destroy();
  }
}

const idle = new Map();  // socket path → [Connection]

function checkOut(path) {
  const kept = idle.get(path) ?? [];
  while (kept.length > 0) {
    const connection = kept.pop();
    if (connection.reusable) return { connection, reused: true };
    connection.close();
  }
  return null;
}

function checkIn(connection) {
  const kept = idle.get(connection.path) ?? [];
  if (!connection.reusable || kept.length >= MAX_IDLE) return connection.close();
  connection.socket.unref();
  kept.push(connection);
  idle.set(connection.path, kept);
}

/** A new connection to a listener this process trusts; nothing is sent to one it does not. */
async function connect(path) {
  const refusal = untrustedOwner(path);
  if (refusal) throw refusal;
  const connection = await Connection.open(path);
  // The path may have been replaced between the check and the connect: check the file again.
  const after = untrustedOwner(path);
  if (after) {
    connection.close();
    throw after;
  }
  return connection;
}

/**
 * One call: the request, then keychaind's prompts answered by `answer(question)` until its reply.
 * @param {MessageBuilder} request
 * @param {(question: object) => Promise<object>} answer  resolves with a prompt answer (`encodeAnswer`'s input)
 * @returns {Promise<Message>} the ok reply; an error reply rejects with its KeychainError
 */
async function call(path, request, answer) {
  let pooled = checkOut(path);
  let connection = pooled ? pooled.connection : await connect(path);
  let complete = false;
  try {
    let reply;
    try {
      reply = await connection.exchange(request);
    } catch (failure) {
      // A kept connection keychaind closed while idle (its idle timeout, a restart), the request unread: once more, on a new one.
      const unread = pooled && !failure.receivedAny && failure.reason === 'io'
        && ['EPIPE', 'ECONNRESET'].includes(failure.error?.code);
      if (!unread) throw failure;
      connection.close();
      pooled = null;
      connection = await connect(path);
      reply = await connection.exchange(request);
    }
    while (reply.kind === Kind.prompt) {
      const question = decodeQuestion(reply);
      const given = await answer(question);
      const message = encodeAnswer(given);
      try {
        reply = await connection.exchange(message);
      } finally {
        message.wipe();
        if (given.passcode) given.passcode.fill(0);
      }
    }
    if (reply.kind === Kind.ok) {
      complete = true;
      return reply;
    }
    if (reply.kind === Kind.error) {
      complete = true;
      const code = reply.string(Tag.errorCode);
      if (code === undefined) throw { reason: 'malformed', error: new WireError('malformed', 'error without a code') };
      throw new KeychainError(code, reply.string(Tag.errorMessage) ?? '', decodeCause(reply));
    }
    throw new KeychainError(KeychainErrorCode.Internal, `The keychain service sent a reply of unknown kind ${reply.kind}`);
  } catch (failure) {
    if (failure instanceof KeychainError) throw failure;
    if (failure && failure.reason) {
      throw exchangeFailure(path, failure.reason, failure.error?.code ? `${failure.error.code}` : failure.error?.message);
    }
    throw failure;
  } finally {
    request.wipe();
    if (complete) checkIn(connection); else connection.close();
  }
}

module.exports = { resolveSocket, call, SYSTEM_SOCKET, MessageBuilder };
