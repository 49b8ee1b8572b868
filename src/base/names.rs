//! Enums with stable names: the vocabulary of outcomes, failure classes, reasons, transports
//! and states. `as_str` is called where JSON, metrics, logs or the store are written and
//! `from_name` where a stored name is read back; decisions are made on the values, never on
//! their names.

/// Declares a fieldless enum with one stable name per variant.
macro_rules! named {
    ($(#[$meta:meta])* $vis:vis enum $name:ident {
        $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        $vis enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The value's place in [`Self::ALL`].
            pub fn index(self) -> usize {
                self as usize
            }

            /// The stable name: what JSON, metrics, logs and the store show.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            /// The value a stored name stands for.
            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use named;

#[cfg(test)]
mod tests {
    named! {
        /// A test enum.
        enum Colour {
            Red => "red",
            DarkBlue => "dark_blue",
        }
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_none() {
        for (i, c) in Colour::ALL.iter().enumerate() {
            assert_eq!(Colour::from_name(c.as_str()), Some(*c));
            assert_eq!(c.index(), i);
        }
        assert_eq!(Colour::DarkBlue.to_string(), "dark_blue");
        assert_eq!(Colour::from_name("green"), None);
    }
}
