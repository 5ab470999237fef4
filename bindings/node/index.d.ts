// The seed's signatures (shared/seeds 000, 001, 004) for keychain-linux, with what Linux adds
// (setPromptHandler, the Linux error codes, the 'noPrompt' reason). docs/node.md describes each.

/** What unlocks an item: nothing, biometrics, the passcode, or both. A constant object and a type of the same name. */
export declare const AccessControl: {
  readonly None: 'none';
  readonly BiometryAny: 'biometryAny';
  readonly BiometryCurrentSet: 'biometryCurrentSet';
  readonly BiometryAnyOrPasscode: 'biometryAnyOrPasscode';
  readonly BiometryCurrentSetOrPasscode: 'biometryCurrentSetOrPasscode';
  readonly Passcode: 'passcode';
};
export type AccessControl = (typeof AccessControl)[keyof typeof AccessControl];

/** When an item can be read: Apple's seven levels. */
export declare const Accessible: {
  readonly WhenUnlocked: 'whenUnlocked';
  readonly AfterFirstUnlock: 'afterFirstUnlock';
  readonly Always: 'always';
  readonly WhenPasscodeSetThisDeviceOnly: 'whenPasscodeSetThisDeviceOnly';
  readonly WhenUnlockedThisDeviceOnly: 'whenUnlockedThisDeviceOnly';
  readonly AfterFirstUnlockThisDeviceOnly: 'afterFirstUnlockThisDeviceOnly';
  readonly AlwaysThisDeviceOnly: 'alwaysThisDeviceOnly';
};
export type Accessible = (typeof Accessible)[keyof typeof Accessible];

/** Biometric sensors; Linux reports 'fingerprint' only. */
export declare const BiometryType: {
  readonly TouchID: 'touchID';
  readonly FaceID: 'faceID';
  readonly Fingerprint: 'fingerprint';
};
export type BiometryType = (typeof BiometryType)[keyof typeof BiometryType];

export declare const KeychainErrorCode: {
  readonly InvalidArgument: 'INVALID_ARGUMENT';
  readonly UserCanceled: 'USER_CANCELED';
  readonly UserFallback: 'USER_FALLBACK';
  readonly SystemCanceled: 'SYSTEM_CANCELED';
  readonly AuthenticationFailed: 'AUTHENTICATION_FAILED';
  readonly Lockout: 'LOCKOUT';
  readonly LockoutPermanent: 'LOCKOUT_PERMANENT';
  readonly KeyInvalidated: 'KEY_INVALIDATED';
  readonly BiometryNotAvailable: 'BIOMETRY_NOT_AVAILABLE';
  readonly BiometryNotEnrolled: 'BIOMETRY_NOT_ENROLLED';
  readonly PasscodeNotSet: 'PASSCODE_NOT_SET';
  readonly Unsupported: 'UNSUPPORTED';
  readonly MissingUsageDescription: 'MISSING_USAGE_DESCRIPTION';
  readonly InteractionNotAllowed: 'INTERACTION_NOT_ALLOWED';
  readonly DeviceStateChanged: 'DEVICE_STATE_CHANGED';
  readonly DataCorrupted: 'DATA_CORRUPTED';
  readonly HardwareUnavailable: 'HARDWARE_UNAVAILABLE';
  readonly StorageError: 'STORAGE_ERROR';
  readonly AccessDenied: 'ACCESS_DENIED';
  readonly QuotaExceeded: 'QUOTA_EXCEEDED';
  readonly Internal: 'INTERNAL';
};
export type KeychainErrorCode = (typeof KeychainErrorCode)[keyof typeof KeychainErrorCode];

/** The one error: a stable code, a message a person can act on, and what failed below (a TPM, SQLite or errno cause). */
export declare class KeychainError extends Error {
  readonly name: 'KeychainError';
  readonly code: KeychainErrorCode;
  readonly underlying?: string;
}

/** The texts of the prompt a read shows; a field left out keeps the storage's (or the system's). */
export interface Prompt {
  title?: string;
  subtitle?: string;
  description?: string;
  cancel?: string;
}

export interface AndroidOptions {
  /** 'tee': the TPM; 'strongbox': a PKCS#11 token. */
  keyStorage?: 'tee' | 'strongbox';
}

/** A storage's service and the defaults of its calls; every key optional, unknown keys refused. */
export interface KeychainOptions {
  service?: string;
  accessible?: Accessible;
  accessControl?: AccessControl;
  authValidity?: number;
  synchronizable?: boolean;
  accessGroup?: string;
  prompt?: Prompt;
  android?: AndroidOptions;
}

/** A write's overrides of its storage's defaults (the service and access group are the storage's). */
export interface SetItemOptions {
  accessible?: Accessible;
  accessControl?: AccessControl;
  authValidity?: number;
  /** Kept next to the item, outside the secret: readable without a prompt. */
  label?: string;
  synchronizable?: boolean;
}

/** A read's overrides: its prompt, merged with the storage's field by field. */
export interface GetItemOptions {
  prompt?: Prompt;
}

export interface ItemInfo {
  key: string;
  service: string;
  accessible: Accessible;
  accessControl: AccessControl;
  label?: string;
  created: Date;
  modified: Date;
  securityLevel: 'hardwareTPM' | 'softwareTPM' | 'pkcs11Token';
  /** The token that holds the item's key ('pkcs11Token'). */
  token?: string;
}

export interface AccessControlCheck {
  available: boolean;
  reason?: 'notAvailable' | 'notEnrolled' | 'passcodeNotSet' | 'unsupportedOS' | 'unsupported' | 'noPrompt';
}

/** A storage: one service and its defaults for every call. */
export declare class Keychain {
  private constructor();
  /** The options' service, or the application identifier. */
  readonly service: string;
  readonly options: Readonly<Required<Omit<KeychainOptions, 'service' | 'accessGroup' | 'prompt'>>> & KeychainOptions;
  setItem(key: string, value: string, options?: SetItemOptions): Promise<void>;
  getItem(key: string, options?: GetItemOptions): Promise<string | null>;
  hasItem(key: string): Promise<boolean>;
  removeItem(key: string): Promise<void>;
  clear(): Promise<void>;
  getAllKeys(): Promise<string[]>;
  getItemInfo(key: string): Promise<ItemInfo | null>;
  canUseAccessControl(value: AccessControl): Promise<AccessControlCheck>;
  endAuthenticationWindow(): Promise<void>;
}

export declare function createKeychain(options?: KeychainOptions): Keychain;

/** The default storage: the application identifier (KEYCHAIN_APP_ID, the systemd unit, the desktop file) as its service. */
export declare const keychain: Keychain;

export declare function canUseAccessControl(value: AccessControl): Promise<AccessControlCheck>;

export declare function getBiometryTypes(): Promise<BiometryType[]>;

/** What keychaind asks a read's user: the merged prompt texts, the ways to answer, the item, the attempt. */
export interface PromptRequest extends Prompt {
  readonly methods: readonly ('fingerprint' | 'passcode')[];
  readonly service: string;
  readonly key: string;
  /** 1, then more after a wrong passcode or finger. */
  readonly attempt: number;
  /** Why the previous attempt failed ("wrong passcode", "no match"). */
  readonly previousFailure?: string;
}

/** The user's answer: a passcode, a finger touching the reader, or how the prompt ended. */
export type PromptAnswer =
  | { passcode: string | Uint8Array }
  | { finger: string }
  | { unavailable: string }
  | 'cancel'
  | 'fallback'
  | 'interrupted';

/**
 * Registers what answers keychaind's prompts: a function; `null` for none (a prompted read fails with
 * INTERACTION_NOT_ALLOWED, unasked); `undefined` for the default (the terminal when stdin is one).
 */
export declare function setPromptHandler(
  handler: ((request: PromptRequest) => PromptAnswer | Promise<PromptAnswer>) | null | undefined,
  options?: { attemptsPerRead?: number },
): void;
