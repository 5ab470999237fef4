'use strict';
// The prompt of a read behind an access control: keychaind asks, this process answers (keychaind
// never prompts). The program's handler answers; without one, the terminal asks when stdin is one
// (the passcode without echo), else the read ends with INTERACTION_NOT_ALLOWED, as the Swift
// library's SystemAuthenticator does where no prompter reaches anyone.

const fs = require('node:fs');
const tty = require('node:tty');
const { KeychainError, KeychainErrorCode } = require('./options');

const NO_TERMINAL = 'no terminal (stdin is not a TTY) and no prompt handler: register one with setPromptHandler';

/** The handler in force: the program's, or the terminal's (`undefined`), or none at all (`null`). */
let handler;
let attemptsPerRead = 3;

/**
 * Registers the function that answers keychaind's prompts.
 * @param handler `(request) => answer | Promise<answer>`, `null` for none (a read behind an access
 *   control then ends with INTERACTION_NOT_ALLOWED, unasked), `undefined` for the default.
 * @param options `{ attemptsPerRead }`: how many questions one read may ask (1 to 10, default 3).
 */
function setPromptHandler(given, options) {
  if (given !== null && given !== undefined && typeof given !== 'function') {
    throw new KeychainError(KeychainErrorCode.InvalidArgument, 'Invalid prompt handler: expected a function, null or undefined');
  }
  const attempts = options?.attemptsPerRead ?? 3;
  if (!Number.isSafeInteger(attempts) || attempts < 1 || attempts > 10) {
    throw new KeychainError(KeychainErrorCode.InvalidArgument,
      `Invalid attemptsPerRead: expected a whole number from 1 to 10, got ${attempts}`);
  }
  handler = given;
  attemptsPerRead = attempts;
}

/** The `attempts` field a read carries: absent when nothing answers prompts. */
function attempts() { return handler === null ? undefined : attemptsPerRead; }

/** Whether a prompt would reach someone now (for canUseAccessControl's `noPrompt`). */
function reachable() { return handler !== undefined ? handler !== null : Boolean(process.stdin.isTTY); }

const ANSWER_WORDS = ['cancel', 'fallback', 'interrupted'];

/** The handler's answer as the wire's (`encodeAnswer`'s input); a passcode as bytes the sender zeroes. */
function normalize(answer) {
  if (ANSWER_WORDS.includes(answer)) return { kind: answer };
  if (answer && typeof answer === 'object') {
    if (typeof answer.finger === 'string' && answer.finger.length > 0) return { kind: 'finger', finger: answer.finger };
    if (typeof answer.passcode === 'string') return { kind: 'passcode', passcode: Buffer.from(answer.passcode, 'utf8') };
    if (answer.passcode instanceof Uint8Array) return { kind: 'passcode', passcode: Buffer.from(answer.passcode) };
    if (typeof answer.unavailable === 'string') return { kind: 'unavailable', reason: answer.unavailable };
  }
  throw new KeychainError(KeychainErrorCode.InvalidArgument, "Invalid prompt answer: expected { passcode }, { finger }, "
    + "{ unavailable }, 'cancel', 'fallback' or 'interrupted'");
}

/** Answers one of keychaind's prompts. */
async function answer(question) {
  if (handler === null) return { kind: 'interrupted' };
  if (handler === undefined) {
    if (!process.stdin.isTTY) return { kind: 'unavailable', reason: NO_TERMINAL };
    return terminal(question);
  }
  return normalize(await handler(Object.freeze({ ...question, methods: Object.freeze([...question.methods]) })));
}

// MARK: the terminal

/** One line from /dev/tty in raw mode, echoed or not; null for Ctrl-C or Ctrl-D. */
function readLine(label, echo) {
  return new Promise((resolve) => {
    let input, output;
    try {
      input = new tty.ReadStream(fs.openSync('/dev/tty', 'r'));
      output = new tty.WriteStream(fs.openSync('/dev/tty', 'w'));
    } catch {
      input?.destroy();
      return resolve(undefined);
    }
    // Raw (no echo) before the question shows: an answer typed as soon as it shows is never echoed.
    input.setRawMode(true);
    output.write(label);
    const typed = [];
    const finish = (line) => {
      input.setRawMode(false);
      input.removeAllListeners('data');
      input.destroy();
      output.end('\n');
      resolve(line);
    };
    input.on('data', (chunk) => {
      for (const byte of chunk) {
        if (byte === 0x0d || byte === 0x0a) {
          const line = Buffer.from(typed);
          typed.fill(0);
          return finish(line);
        }
        if (byte === 0x03 || byte === 0x04) { typed.fill(0); return finish(null); }
        if (byte === 0x7f || byte === 0x08) {
          if (typed.length > 0) { typed.pop(); if (echo) output.write('\b \b'); }
        } else if (byte >= 0x20) {
          typed.push(byte);
          if (echo) output.write(Buffer.from([byte]));
        }
      }
      chunk.fill(0);
    });
  });
}

/** The questions Swift's terminal prompter asks: a finger (empty: the passcode, when it may), then the passcode. */
async function terminal(question) {
  const title = question.title ?? (question.key ? `Authenticate to read '${question.key}'` : 'Authenticate');
  const details = [question.subtitle, question.description].filter((t) => t !== undefined);
  if (question.previousFailure) details.push(`${question.previousFailure}, try again`);
  const cancel = question.cancel ?? 'Cancel';
  const header = '\n' + [title, ...details].map((t) => t.replace(/[\x00-\x1f\x7f]/g, '?')).join('\n') + '\n';
  const fingers = question.methods.includes('fingerprint'), passcode = question.methods.includes('passcode');
  let first = true;
  if (fingers) {
    const line = await readLine(`${header}Finger to touch the reader (enter alone: ${passcode ? 'use the passcode' : cancel}): `, true);
    first = false;
    if (line === undefined) return { kind: 'unavailable', reason: 'terminal: /dev/tty cannot be opened' };
    if (line === null) return { kind: 'interrupted' };
    if (line.length > 0) return { kind: 'finger', finger: line.toString('utf8') };
    if (!passcode) return { kind: 'cancel' };
  }
  if (!passcode) return { kind: 'cancel' };
  const line = await readLine(`${first ? header : ''}Passcode (enter alone: ${cancel}): `, false);
  if (line === undefined) return { kind: 'unavailable', reason: 'terminal: /dev/tty cannot be opened' };
  if (line === null) return { kind: 'interrupted' };
  return line.length > 0 ? { kind: 'passcode', passcode: line } : { kind: 'cancel' };
}

module.exports = { setPromptHandler, attempts, reachable, answer };
