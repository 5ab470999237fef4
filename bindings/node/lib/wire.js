'use strict';
// keychaind's protocol, version 2 (docs/daemon.md, "The protocol"; the Swift definition is
// Sources/KeychainWire): a frame is a 4-byte big-endian length, then the message
// `[version][kind]` and fields `[tag][4-byte length][bytes]` in strictly increasing tag order.
// Integers are 8-byte big-endian, booleans one byte, text UTF-8; nested options are messages of kind 0.

const VERSION = 2;
/** The largest message: a 16 MiB value plus room for the options and key (`Wire.maxMessage`). */
const MAX_MESSAGE = 16 * 1024 * 1024 + 64 * 1024;

/** Request kinds (`WireOp`). */
const Op = Object.freeze({
  setItem: 1, getItem: 2, hasItem: 3, removeItem: 4, clear: 5, allKeys: 6, itemInfo: 7, storageCanUse: 8,
  endWindows: 9, biometryTypes: 24, deviceCanUse: 25,
});

/** Message kinds other than requests (`WireKind`). */
const Kind = Object.freeze({ fields: 0, ok: 0x80, error: 0x81, prompt: 0x82, answer: 0x83 });

/** Field tags (`WireTag`). */
const Tag = Object.freeze({
  options: 1, key: 2, value: 3, accessible: 4, accessControl: 5, authValidity: 6, label: 7, synchronizable: 8,
  prompt: 9, attempts: 10,
  resultBytes: 20, resultBool: 21, resultJSON: 22,
  errorCode: 30, errorMessage: 31, causeKind: 32, causeNumber: 33, causeText: 34,
  promptTexts: 40, methods: 41, service: 42, promptKey: 43, attempt: 44, previousFailure: 45,
  answerKind: 50, answerFinger: 51, answerPasscode: 52, answerReason: 53,
});

/** The tags of a nested storage options message (`WireStorageOptions.Tag`) and of prompt texts (`WirePrompt.Tag`). */
const OptionsTag = Object.freeze({
  service: 1, accessible: 2, accessControl: 3, authValidity: 4, synchronizable: 5, accessGroup: 6, prompt: 7, keyStorage: 8,
  serviceIsDefault: 9,
});
const PromptTag = Object.freeze({ title: 1, subtitle: 2, description: 3, cancel: 4 });

/** A prompt answer's number (`WirePromptAnswer.Kind`). */
const AnswerKind = Object.freeze({ finger: 0, passcode: 1, cancel: 2, fallback: 3, interrupted: 4, unavailable: 5 });

class WireError extends Error {
  /** @param {'malformed'|'version'|'badLength'} kind */
  constructor(kind, detail) {
    super(detail);
    this.kind = kind;
  }
}

/** A message being built: fields added in increasing tag order, absent values skipped. */
class MessageBuilder {
  constructor(kind) {
    this.kind = kind;
    this.fields = [];
  }

  /** @param {Buffer|Uint8Array|undefined|null} bytes */
  bytes(tag, bytes, secret = false) {
    if (bytes === undefined || bytes === null) return this;
    const last = this.fields[this.fields.length - 1];
    if (last && last.tag >= tag) throw new Error(`fields in increasing tag order: ${tag} after ${last.tag}`);
    this.fields.push({ tag, secret, bytes: Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength) });
    return this;
  }

  /** A field that holds a secret (a value, a passcode): `wipe()` zeroes it. */
  secret(tag, bytes) { return this.bytes(tag, bytes, true); }

  string(tag, text) { return text === undefined || text === null ? this : this.bytes(tag, Buffer.from(text, 'utf8')); }

  /** An integer as 8 bytes, big-endian, two's complement (`UInt64(bitPattern: Int64(value))`). */
  int(tag, value) {
    if (value === undefined || value === null) return this;
    const out = Buffer.alloc(8);
    out.writeBigInt64BE(BigInt(value));
    return this.bytes(tag, out);
  }

  bool(tag, value) { return value === undefined || value === null ? this : this.bytes(tag, Buffer.from([value ? 1 : 0])); }

  /** The message's bytes; `framed` puts its 4-byte length before it. */
  encode(framed = false) {
    const length = 2 + this.fields.reduce((sum, f) => sum + 5 + f.bytes.length, 0);
    const out = Buffer.alloc((framed ? 4 : 0) + length);
    let at = 0;
    if (framed) at = out.writeUInt32BE(length, 0);
    out[at++] = VERSION;
    out[at++] = this.kind;
    for (const { tag, bytes } of this.fields) {
      out[at++] = tag;
      at = out.writeUInt32BE(bytes.length, at);
      bytes.copy(out, at);
      at += bytes.length;
    }
    return out;
  }

  /** Zeroes the secret fields (the frame sent is zeroed once written). */
  wipe() { for (const f of this.fields) if (f.secret) f.bytes.fill(0); }
}

/** A decoded message: its kind and its fields by tag (`WireMessage.decode`). */
class Message {
  constructor(kind, fields) {
    this.kind = kind;
    this.fields = fields;
  }

  static decode(data) {
    if (data.length < 2) throw new WireError('malformed', 'message shorter than its header');
    if (data[0] !== VERSION) throw new WireError('version', `protocol version ${data[0]}, this side speaks ${VERSION}`);
    const fields = new Map();
    let at = 2, last = -1;
    while (at < data.length) {
      if (data.length - at < 5) throw new WireError('malformed', `field header cut at byte ${at}`);
      const tag = data[at];
      const length = data.readUInt32BE(at + 1);
      at += 5;
      if (length > data.length - at) throw new WireError('malformed', `field ${tag} runs past the message`);
      if (tag <= last) throw new WireError('malformed', `field ${tag} out of order or repeated`);
      fields.set(tag, data.subarray(at, at + length));
      last = tag;
      at += length;
    }
    return new Message(data[1], fields);
  }

  bytes(tag) { return this.fields.get(tag); }

  string(tag) {
    const bytes = this.fields.get(tag);
    if (bytes === undefined) return undefined;
    try {
      return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
    } catch {
      throw new WireError('malformed', `field ${tag} is not UTF-8`);
    }
  }

  uint(tag) {
    const bytes = this.fields.get(tag);
    if (bytes === undefined) return undefined;
    if (bytes.length !== 8) throw new WireError('malformed', `field ${tag} is not an 8-byte integer`);
    return bytes.readBigUInt64BE(0);
  }

  bool(tag) {
    const bytes = this.fields.get(tag);
    if (bytes === undefined) return undefined;
    if (bytes.length !== 1 || bytes[0] > 1) throw new WireError('malformed', `field ${tag} is not a boolean`);
    return bytes[0] === 1;
  }

  json(tag) {
    const text = this.string(tag);
    if (text === undefined) return undefined;
    try {
      return JSON.parse(text);
    } catch (error) {
      throw new WireError('malformed', `field ${tag} is not JSON: ${error.message}`);
    }
  }
}

/** Prompt texts as a nested message (`WirePrompt.encoded`); undefined when there are none. */
function encodePrompt(prompt) {
  if (!prompt) return undefined;
  return new MessageBuilder(Kind.fields)
    .string(PromptTag.title, prompt.title)
    .string(PromptTag.subtitle, prompt.subtitle)
    .string(PromptTag.description, prompt.description)
    .string(PromptTag.cancel, prompt.cancel)
    .encode();
}

function decodePrompt(bytes) {
  if (bytes === undefined) return {};
  const message = Message.decode(bytes);
  if (message.kind !== Kind.fields) throw new WireError('malformed', 'the prompt field is not a list of fields');
  const texts = {};
  for (const name of ['title', 'subtitle', 'description', 'cancel']) {
    const value = message.string(PromptTag[name]);
    if (value !== undefined) texts[name] = value;
  }
  return texts;
}

/** A storage's options, every field, as the Swift library sends them (`KeychainOptions.wire`); `serviceIsDefault`
 * when the caller named no service (keychaind gives a confined caller its application id). */
function encodeStorageOptions(o) {
  return new MessageBuilder(Kind.fields)
    .string(OptionsTag.service, o.service)
    .string(OptionsTag.accessible, o.accessible)
    .string(OptionsTag.accessControl, o.accessControl)
    .int(OptionsTag.authValidity, o.authValidity)
    .bool(OptionsTag.synchronizable, o.synchronizable)
    .string(OptionsTag.accessGroup, o.accessGroup)
    .bytes(OptionsTag.prompt, encodePrompt(o.prompt))
    .string(OptionsTag.keyStorage, o.android.keyStorage)
    .bool(OptionsTag.serviceIsDefault, o.serviceIsDefault)
    .encode();
}

/** The cause of an error reply (`WireErrorReply`), in the words of `WireCause.description`. */
function decodeCause(message) {
  const kind = message.uint(Tag.causeKind);
  if (kind === undefined) return undefined;
  const number = message.uint(Tag.causeNumber) ?? 0n;
  const text = message.string(Tag.causeText) ?? '';
  const hex = (value) => '0x' + value.toString(16).toUpperCase().padStart(8, '0');
  switch (Number(kind)) {
    case 0: return `TPM ${text} (${hex(number & 0xffffffffn)})`;
    case 1: return `SQLite ${Number(BigInt.asIntN(32, number))}: ${text}`;
    case 2: return `errno ${Number(BigInt.asIntN(32, number))}`;
    case 3: return `PKCS#11 ${text} (${hex(number)})`;
    default: return text;
  }
}

/** A prompt answer message (`WirePromptAnswer.message`). */
function encodeAnswer(answer) {
  const message = new MessageBuilder(Kind.answer).int(Tag.answerKind, AnswerKind[answer.kind]);
  if (answer.kind === 'finger') message.string(Tag.answerFinger, answer.finger);
  if (answer.kind === 'passcode') message.secret(Tag.answerPasscode, answer.passcode);
  if (answer.kind === 'unavailable') message.string(Tag.answerReason, answer.reason);
  return message;
}

/** keychaind's prompt (`WirePromptQuestion`): absent texts are the system's, an absent attempt the first. */
function decodeQuestion(message) {
  const methods = message.json(Tag.methods) ?? [];
  const question = {
    ...decodePrompt(message.bytes(Tag.promptTexts)),
    methods: Array.isArray(methods) ? methods.filter((m) => typeof m === 'string') : [],
    service: message.string(Tag.service) ?? '',
    key: message.string(Tag.promptKey) ?? '',
    attempt: Number(message.uint(Tag.attempt) ?? 1n),
  };
  const previousFailure = message.string(Tag.previousFailure);
  if (previousFailure !== undefined) question.previousFailure = previousFailure;
  return question;
}

module.exports = {
  VERSION, MAX_MESSAGE, Op, Kind, Tag, AnswerKind, WireError, MessageBuilder, Message,
  encodePrompt, encodeStorageOptions, decodeCause, encodeAnswer, decodeQuestion,
};
