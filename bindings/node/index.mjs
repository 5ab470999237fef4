// The ES module form of the package: the same objects as index.js (one copy of the state, the prompt handler).
import api from './index.js';

export const {
  AccessControl, Accessible, BiometryType, KeychainError, KeychainErrorCode, Keychain, createKeychain, keychain,
  canUseAccessControl, getBiometryTypes, setPromptHandler,
} = api;
export default api;
