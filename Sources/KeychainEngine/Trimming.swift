extension String {
    /// Without the spaces and tabs (Unicode Zs) at either end, as Foundation's
    /// `trimmingCharacters(in: .whitespaces)`; with `newlines`, as `.whitespacesAndNewlines`
    /// (also Zl, Zp, U+000A to U+000D and U+0085).
    func trimmingSpaces(newlines: Bool = false) -> String {
        func isSpace(_ scalar: Unicode.Scalar) -> Bool {
            switch scalar.properties.generalCategory {
            case .spaceSeparator: true
            case .lineSeparator, .paragraphSeparator: newlines
            default: scalar == "\t" || (newlines && ((0x0A...0x0D).contains(scalar.value) || scalar.value == 0x85))
            }
        }
        let scalars = unicodeScalars
        guard let first = scalars.firstIndex(where: { !isSpace($0) }), let last = scalars.lastIndex(where: { !isSpace($0) }) else { return "" }
        return String(scalars[first...last])
    }
}
