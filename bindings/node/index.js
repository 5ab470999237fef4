'use strict';
// The seed's JavaScript API (createKeychain, keychain, AccessControl, Accessible, canUseAccessControl,
// KeychainError) for Node, on keychaind's protocol: no TPM, SQLite or Swift runtime in this process.
// docs/node.md has the API, the error codes and what differs from the mobile library.

const { Op, Tag, MessageBuilder, encodeStorageOptions, encodePrompt } = require('./lib/wire');
const {
  AccessControl, Accessible, BiometryType, KeychainErrorCode, KeychainError, checkStorageOptions, checkSetOptions,
  checkGetOptions, checkKey, checkValue, checkAccessControl, serviceProblem,
} = require('./lib/options');
const { resolveSocket, call } = require('./lib/connection');
const prompt = require('./lib/prompt');
const { applicationIdentifier } = require('./lib/identity');

function missingIdentifier() {
  return new KeychainError(KeychainErrorCode.InvalidArgument, 'No application identifier for the default service: set '
    + 'KEYCHAIN_APP_ID, run the program as its systemd unit or from its desktop file, or give the storage a service '
    + "(createKeychain({ service: '…' }))");
}

/** The service when the options name none: the application identifier, checked as a service. */
function defaultService() {
  const id = applicationIdentifier();
  if (id === undefined) throw missingIdentifier();
  const problem = serviceProblem(id);
  if (problem) throw new KeychainError(KeychainErrorCode.InvalidArgument, problem);
  return id;
}

function internal(what) {
  return new KeychainError(KeychainErrorCode.Internal, `The keychain service's reply has no ${what}`);
}

/** `canUseAccessControl`'s answer, or `noPrompt` when the device can give `value` but no prompt reaches anyone. */
function withPromptReach(value, check) {
  if (!check || typeof check.available !== 'boolean') throw internal('access control check');
  const answer = { available: check.available };
  if (check.reason !== undefined && check.reason !== null) answer.reason = check.reason;
  if (answer.available && value !== AccessControl.None && !prompt.reachable()) return { available: false, reason: 'noPrompt' };
  return answer;
}

/** keychaind's dates are seconds since 2001-01-01 (Foundation's reference date). */
const referenceDate = Date.UTC(2001, 0, 1);
const date = (seconds) => new Date(referenceDate + Math.round(seconds * 1000));

/** A storage: one service and its defaults for every call (seed: createKeychain). */
class Keychain {
  #options;
  #service;
  #wireOptions;

  /** @internal Made by createKeychain (options checked) or for `keychain` (service found at its first call). */
  constructor(options, service) {
    this.#options = options;
    this.#service = service;
  }

  /** The service its items belong to: the options' service, or the application identifier. */
  get service() { return this.#resolved(); }

  /** The storage's options, checked, with the seed's defaults. */
  get options() { return this.#options; }

  #resolved() {
    if (this.#service === undefined) this.#service = this.#options.service ?? defaultService();
    return this.#service;
  }

  /** One request of this storage: its options (service resolved), then the call's fields. */
  async #call(op, key, build) {
    const service = this.#resolved();
    this.#wireOptions ??= encodeStorageOptions({ ...this.#options, service, serviceIsDefault: this.#options.service == null ? true : undefined });
    const request = new MessageBuilder(op).bytes(Tag.options, this.#wireOptions).string(Tag.key, key);
    build?.(request);
    return call(resolveSocket(), request, prompt.answer);
  }

  /** Stores `value` under `key`, replacing any value atomically; never prompts. */
  async setItem(key, value, options) {
    checkKey(key);
    checkValue(value);
    const call = checkSetOptions(options, this.#options);
    const bytes = Buffer.from(value, 'utf8');
    try {
      await this.#call(Op.setItem, key, (request) => request
        .secret(Tag.value, bytes)
        .string(Tag.accessible, call?.accessible)
        .string(Tag.accessControl, call?.accessControl)
        .int(Tag.authValidity, call?.authValidity)
        .string(Tag.label, call?.label)
        .bool(Tag.synchronizable, call?.synchronizable));
    } finally {
      bytes.fill(0);
    }
  }

  /** The value, or null when there is none; an item behind an access control prompts (the prompt handler). */
  async getItem(key, options) {
    checkKey(key);
    const texts = checkGetOptions(options);
    const reply = await this.#call(Op.getItem, key, (request) => request
      .bytes(Tag.prompt, encodePrompt(texts))
      .int(Tag.attempts, prompt.attempts()));
    const bytes = reply.bytes(Tag.resultBytes);
    if (bytes === undefined) return null;
    try {
      return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
    } catch {
      throw new KeychainError(KeychainErrorCode.InvalidArgument, `Item '${key}' holds bytes that are not UTF-8 text`);
    } finally {
      bytes.fill(0);
    }
  }

  /** Whether an item exists; never prompts. */
  async hasItem(key) {
    checkKey(key);
    const present = (await this.#call(Op.hasItem, key)).bool(Tag.resultBool);
    if (present === undefined) throw internal('boolean result');
    return present;
  }

  /** Removes an item; removing an absent one is not an error. */
  async removeItem(key) {
    checkKey(key);
    await this.#call(Op.removeItem, key);
  }

  /** Removes every item of this storage's service; never prompts. */
  async clear() { await this.#call(Op.clear); }

  /** The keys of this storage's items, sorted. */
  async getAllKeys() {
    const keys = (await this.#call(Op.allKeys)).json(Tag.resultJSON);
    if (!Array.isArray(keys)) throw internal('list of keys');
    return keys;
  }

  /** What is known of an item without reading its value (no prompt), or null when there is none. */
  async getItemInfo(key) {
    checkKey(key);
    const info = (await this.#call(Op.itemInfo, key)).json(Tag.resultJSON);
    if (info === undefined) return null;
    return { ...info, created: date(info.created), modified: date(info.modified) };
  }

  /** Whether this storage's device can protect an item with `value` now; never prompts, never writes. */
  async canUseAccessControl(value) {
    checkAccessControl(value);
    const reply = await this.#call(Op.storageCanUse, undefined, (request) => request.string(Tag.accessControl, value));
    return withPromptReach(value, reply.json(Tag.resultJSON));
  }

  /** Ends the authValidity window of this storage's items: the next read asks again. */
  async endAuthenticationWindow() { await this.#call(Op.endWindows); }
}

/** Makes a storage; the options are checked at once (INVALID_ARGUMENT), the keychain is not touched. */
function createKeychain(options) {
  const checked = checkStorageOptions(options);
  return new Keychain(checked, checked.service ?? defaultService());
}

/** The default storage: the application identifier as its service, the seed's defaults. */
const keychain = new Keychain(checkStorageOptions({}), undefined);

/** Whether the device can protect an item with `value` now, and why not; never prompts. */
async function canUseAccessControl(value) {
  checkAccessControl(value);
  const reply = await call(resolveSocket(), new MessageBuilder(Op.deviceCanUse).string(Tag.accessControl, value), prompt.answer);
  return withPromptReach(value, reply.json(Tag.resultJSON));
}

/** The device's biometric sensors: `['fingerprint']` when keychaind has a reader, else none. */
async function getBiometryTypes() {
  const types = (await call(resolveSocket(), new MessageBuilder(Op.biometryTypes), prompt.answer)).json(Tag.resultJSON);
  if (!Array.isArray(types)) throw internal('list of biometry types');
  return types;
}

module.exports = {
  AccessControl, Accessible, BiometryType, KeychainError, KeychainErrorCode, Keychain, createKeychain, keychain,
  canUseAccessControl, getBiometryTypes, setPromptHandler: prompt.setPromptHandler,
};
