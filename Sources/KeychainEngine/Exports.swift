/// The engine's API speaks in the core's values and `SecureBytes`: a module importing the engine gets
/// them too (as `import Keychain` does), and the engine's own files see them without importing each.
@_exported import SecureMemory
@_exported import KeychainCore
