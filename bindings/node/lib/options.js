'use strict';
// The seed's constants, its error, and its option checks, with the Swift library's messages
// (Sources/Keychain/Options, Sources/KeychainStore/ItemNames.swift), so a program sees the same
// INVALID_ARGUMENT words from Node as from Swift, keychainctl and keychaind.

/** What unlocks an item (seed 000). */
const AccessControl = Object.freeze({
  None: 'none',
  BiometryAny: 'biometryAny',
  BiometryCurrentSet: 'biometryCurrentSet',
  BiometryAnyOrPasscode: 'biometryAnyOrPasscode',
  BiometryCurrentSetOrPasscode: 'biometryCurrentSetOrPasscode',
  Passcode: 'passcode',
});

/** When an item can be read: Apple's seven kSecAttrAccessible levels (seed 002). */
const Accessible = Object.freeze({
  WhenUnlocked: 'whenUnlocked',
  AfterFirstUnlock: 'afterFirstUnlock',
  Always: 'always',
  WhenPasscodeSetThisDeviceOnly: 'whenPasscodeSetThisDeviceOnly',
  WhenUnlockedThisDeviceOnly: 'whenUnlockedThisDeviceOnly',
  AfterFirstUnlockThisDeviceOnly: 'afterFirstUnlockThisDeviceOnly',
  AlwaysThisDeviceOnly: 'alwaysThisDeviceOnly',
});

/**
 * Biometric sensors. Linux reports `fingerprint` only (a reader directory configured in keychaind);
 * the mobile names exist so that the seed's comparisons run (they are never reported here).
 */
const BiometryType = Object.freeze({ TouchID: 'touchID', FaceID: 'faceID', Fingerprint: 'fingerprint' });

/** The codes of `KeychainError`: the seed's, then Linux's own (`KeychainError.Code`). */
const KeychainErrorCode = Object.freeze({
  InvalidArgument: 'INVALID_ARGUMENT',
  UserCanceled: 'USER_CANCELED',
  UserFallback: 'USER_FALLBACK',
  SystemCanceled: 'SYSTEM_CANCELED',
  AuthenticationFailed: 'AUTHENTICATION_FAILED',
  Lockout: 'LOCKOUT',
  LockoutPermanent: 'LOCKOUT_PERMANENT',
  KeyInvalidated: 'KEY_INVALIDATED',
  BiometryNotAvailable: 'BIOMETRY_NOT_AVAILABLE',
  BiometryNotEnrolled: 'BIOMETRY_NOT_ENROLLED',
  PasscodeNotSet: 'PASSCODE_NOT_SET',
  Unsupported: 'UNSUPPORTED',
  MissingUsageDescription: 'MISSING_USAGE_DESCRIPTION',
  InteractionNotAllowed: 'INTERACTION_NOT_ALLOWED',
  DeviceStateChanged: 'DEVICE_STATE_CHANGED',
  DataCorrupted: 'DATA_CORRUPTED',
  HardwareUnavailable: 'HARDWARE_UNAVAILABLE',
  StorageError: 'STORAGE_ERROR',
  AccessDenied: 'ACCESS_DENIED',
  QuotaExceeded: 'QUOTA_EXCEEDED',
  Internal: 'INTERNAL',
});

/** The one error: a stable `code`, a `message` a person can act on, and what failed below (`underlying`). */
class KeychainError extends Error {
  constructor(code, message, underlying) {
    super(message);
    this.name = 'KeychainError';
    this.code = code;
    if (underlying !== undefined) this.underlying = underlying;
  }

  /** "CODE: message (cause: …)", as Swift's `KeychainError.description`. */
  toString() {
    let text = this.message ? `${this.code}: ${this.message}` : this.code;
    if (this.underlying !== undefined) text += ` (cause: ${this.underlying})`;
    return `KeychainError ${text}`;
  }
}

const invalid = (message) => new KeychainError(KeychainErrorCode.InvalidArgument, message);

const MAX_SERVICE_LENGTH = 256, MAX_ACCESS_GROUP_LENGTH = 256;
const ACCESSIBLE = Object.values(Accessible), ACCESS_CONTROL = Object.values(AccessControl), KEY_STORAGE = ['tee', 'strongbox'];
const oneOf = (values) => 'one of ' + values.map((v) => `'${v}'`).join(', ');

/** What a value is, for "got …" (Swift's `describeValue`). */
function describe(value) {
  if (value === null) return 'null';
  if (typeof value === 'boolean' || typeof value === 'number') return String(value);
  if (typeof value === 'string') return `'${value}'`;
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'object') return 'an object';
  return 'a value of another type';
}

const isObject = (value) => typeof value === 'object' && value !== null && !Array.isArray(value);

/** The keys of an options object once it holds only `known` (the seed: a misspelt accessControl is an error). */
function checkKeys(value, path, known) {
  if (!isObject(value)) {
    throw invalid(`Invalid ${path ?? 'keychain options'}: expected an object with the key${known.length === 1 ? '' : 's'} `
      + `${known.join(', ')}, got ${describe(value)}`);
  }
  const unknown = Object.keys(value).filter((k) => !known.includes(k)).map((k) => (path ? `${path}.${k}` : k)).sort();
  if (unknown.length === 1) throw invalid(`Invalid keychain options: unknown option '${unknown[0]}'`);
  if (unknown.length > 1) throw invalid(`Invalid keychain options: unknown options ${unknown.map((k) => `'${k}'`).join(', ')}`);
}

/** The option at `key`, undefined when absent or null (the default applies); `valid` checks its type. */
function option(object, key, path, expected, valid) {
  const value = object[key];
  if (value === undefined || value === null) return undefined;
  if (!valid(value)) throw invalid(`Invalid ${path}: expected ${expected}, got ${describe(value)}`);
  return value;
}

const choice = (values) => (v) => typeof v === 'string' && values.includes(v);
const wholeNumber = (v) => Number.isSafeInteger(v);
const string = (v) => typeof v === 'string';
const boolean = (v) => typeof v === 'boolean';

function checkPrompt(value, path) {
  if (value === undefined || value === null) return undefined;
  checkKeys(value, path, ['title', 'subtitle', 'description', 'cancel']);
  const prompt = {};
  for (const field of ['title', 'subtitle', 'description', 'cancel']) {
    const text = option(value, field, `${path}.${field}`, 'a string', string);
    if (text !== undefined) prompt[field] = text;
  }
  return prompt;
}

function serviceProblem(service) {
  if (service.length > 0 && service.length <= MAX_SERVICE_LENGTH) return undefined;
  const got = service.length === 0 ? 'an empty string' : `${service.length} characters`;
  return `Invalid service: expected a non-empty string of up to ${MAX_SERVICE_LENGTH} characters, got ${got}`;
}

function accessGroupProblem(group) {
  if (group.length === 0) {
    return 'Invalid accessGroup: expected a non-empty string, got an empty string; leave it out for the default group';
  }
  if (group.length <= MAX_ACCESS_GROUP_LENGTH) return undefined;
  return `Invalid accessGroup: expected a non-empty string of up to ${MAX_ACCESS_GROUP_LENGTH} characters, got ${group.length} characters`;
}

const THIS_DEVICE_ONLY = ['whenPasscodeSetThisDeviceOnly', 'whenUnlockedThisDeviceOnly', 'afterFirstUnlockThisDeviceOnly',
  'alwaysThisDeviceOnly'];
const MOVABLE = { whenUnlockedThisDeviceOnly: 'whenUnlocked', afterFirstUnlockThisDeviceOnly: 'afterFirstUnlock',
  alwaysThisDeviceOnly: 'always' };

/** The seed's rules on one protection (`ItemProtection.init`), each with the Swift library's message. */
function checkProtection({ accessible, accessControl, authValidity, synchronizable }) {
  if (authValidity < 0) {
    throw invalid(`Invalid authValidity: expected a whole number of seconds, 0 or more, got ${authValidity}`);
  }
  if (authValidity > 0 && (accessControl === 'biometryCurrentSet' || accessControl === 'biometryCurrentSetOrPasscode')) {
    const other = accessControl === 'biometryCurrentSet' ? 'biometryAny' : 'biometryAnyOrPasscode';
    throw invalid(`accessControl '${accessControl}' can't be used with authValidity > 0 (got ${authValidity}): `
      + `set authValidity to 0, or use '${other}' to allow a window`);
  }
  if (synchronizable && THIS_DEVICE_ONLY.includes(accessible)) {
    const fix = MOVABLE[accessible] ? `set synchronizable to false, or use accessible '${MOVABLE[accessible]}'` : 'set synchronizable to false';
    throw invalid(`synchronizable can't be used with accessible '${accessible}': a ThisDeviceOnly item never leaves this device; ${fix}`);
  }
  if (synchronizable && accessControl !== 'none') {
    throw invalid(`synchronizable can't be used with accessControl '${accessControl}': an item behind authentication never `
      + "leaves this device; set synchronizable to false, or use accessControl 'none'");
  }
}

const STORAGE_KEYS = ['service', 'accessible', 'accessControl', 'authValidity', 'synchronizable', 'accessGroup', 'prompt', 'android'];

/**
 * A storage's options with the seed's defaults, checked (`KeychainOptions.init(from:)` then `validated()`).
 * @returns {{service?: string, accessible: string, accessControl: string, authValidity: number,
 *            synchronizable: boolean, accessGroup?: string, prompt?: object, android: {keyStorage: string}}}
 */
function checkStorageOptions(options) {
  if (options === undefined || options === null) options = {};
  checkKeys(options, undefined, STORAGE_KEYS);
  const checked = {
    service: option(options, 'service', 'service', `a non-empty string of up to ${MAX_SERVICE_LENGTH} characters`, string),
    accessible: option(options, 'accessible', 'accessible', oneOf(ACCESSIBLE), choice(ACCESSIBLE)) ?? 'afterFirstUnlock',
    accessControl: option(options, 'accessControl', 'accessControl', oneOf(ACCESS_CONTROL), choice(ACCESS_CONTROL)) ?? 'none',
    authValidity: option(options, 'authValidity', 'authValidity', 'a whole number of seconds, 0 or more', wholeNumber) ?? 0,
    synchronizable: option(options, 'synchronizable', 'synchronizable', 'true or false', boolean) ?? false,
    accessGroup: option(options, 'accessGroup', 'accessGroup', 'a non-empty string', string),
    prompt: checkPrompt(options.prompt, 'prompt'),
    android: { keyStorage: 'tee' },
  };
  if (options.android !== undefined && options.android !== null) {
    checkKeys(options.android, 'android', ['keyStorage']);
    checked.android.keyStorage = option(options.android, 'keyStorage', 'android.keyStorage', oneOf(KEY_STORAGE),
      choice(KEY_STORAGE)) ?? 'tee';
  }
  const problem = (checked.service !== undefined ? serviceProblem(checked.service) : undefined)
    ?? (checked.accessGroup !== undefined ? accessGroupProblem(checked.accessGroup) : undefined);
  if (problem) throw invalid(problem);
  checkProtection(checked);
  return Object.freeze(checked);
}

/** A write's overrides (`SetItemOptions`), checked with the storage's defaults by the same rules. */
function checkSetOptions(options, storage) {
  if (options === undefined || options === null) return undefined;
  checkKeys(options, undefined, ['accessible', 'accessControl', 'authValidity', 'label', 'synchronizable']);
  const call = {
    accessible: option(options, 'accessible', 'accessible', oneOf(ACCESSIBLE), choice(ACCESSIBLE)),
    accessControl: option(options, 'accessControl', 'accessControl', oneOf(ACCESS_CONTROL), choice(ACCESS_CONTROL)),
    authValidity: option(options, 'authValidity', 'authValidity', 'a whole number of seconds, 0 or more', wholeNumber),
    label: option(options, 'label', 'label', 'a string', string),
    synchronizable: option(options, 'synchronizable', 'synchronizable', 'true or false', boolean),
  };
  checkProtection({
    accessible: call.accessible ?? storage.accessible,
    accessControl: call.accessControl ?? storage.accessControl,
    authValidity: call.authValidity ?? storage.authValidity,
    synchronizable: call.synchronizable ?? storage.synchronizable,
  });
  return call;
}

/** A read's overrides (`GetItemOptions`): its prompt, merged over the storage's field by field by keychaind. */
function checkGetOptions(options) {
  if (options === undefined || options === null) return undefined;
  checkKeys(options, undefined, ['prompt']);
  return checkPrompt(options.prompt, 'prompt');
}

function checkKey(key) {
  if (typeof key !== 'string') throw invalid(`Invalid key: expected a non-empty string of up to 1024 bytes, got ${describe(key)}`);
}

function checkValue(value) {
  if (typeof value !== 'string') throw invalid(`Invalid value: expected a string, got ${describe(value)}`);
}

function checkAccessControl(value) {
  if (!choice(ACCESS_CONTROL)(value)) throw invalid(`Invalid accessControl: expected ${oneOf(ACCESS_CONTROL)}, got ${describe(value)}`);
}

module.exports = {
  AccessControl, Accessible, BiometryType, KeychainErrorCode, KeychainError, checkStorageOptions, checkSetOptions,
  checkGetOptions, checkKey, checkValue, checkAccessControl, serviceProblem,
};
